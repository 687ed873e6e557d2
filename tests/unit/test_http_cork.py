"""The edge's protocol holds each request's first turn of writes and writes it as one
(`edge.security.cork`): byte for byte what uvicorn writes unheld; later writes go straight out;
what is held goes out before anything the protocol writes or closes itself (a malformed
next request's 400, shutdown), and a close writes it first. Over the real
`LimitedHttpToolsProtocol` on a transport that records calls, the request bytes fed by hand,
so the order of the loop's callbacks is the test's to choose."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from uvicorn.server import ServerState

from edge.config import ServerConfig
from edge.security.cork import Cork
from edge.security.http_limits import LimitedConfig, LimitedHttpToolsProtocol

GET = b"GET /x HTTP/1.1\r\nhost: a\r\n\r\n"
START = {"type": "http.response.start", "status": 200, "headers": [(b"x-a", b"b")]}
App = Callable[[Any, Any, Any], Awaitable[None]]


class Transport:
    def __init__(self) -> None:
        self.calls: list[Any] = []  # bytes written, "close"
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(bytes(data))

    def close(self) -> None:
        if not self.closing:
            self.calls.append("close")
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5000)}.get(name)

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def set_protocol(self, protocol: Any) -> None: ...


def body(data: bytes, more: bool = True) -> Any:
    return {"type": "http.response.body", "body": data, "more_body": more}


def connect(app: App) -> tuple[LimitedHttpToolsProtocol, Transport]:
    config = LimitedConfig(app, ServerConfig(), lifespan="off", log_level="critical")
    config.load()
    proto = LimitedHttpToolsProtocol(config, ServerState(), {})
    transport = Transport()
    proto.connection_made(transport)  # type: ignore[arg-type]
    return proto, transport


def response(*parts: bytes, close: bool = False) -> bytes:
    """What uvicorn writes for START then `parts` (chunked), head first."""
    head = b"HTTP/1.1 200 OK\r\nx-a: b\r\n"
    head += b"connection: close\r\n" if close else b""
    head += b"transfer-encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"


async def until(cond: Callable[[], bool]) -> None:
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0)  # one loop turn, not a time
    raise AssertionError("condition never held")


async def test_a_turns_writes_go_out_as_one_then_the_rest_straight() -> None:
    later = asyncio.Event()
    seen: list[list[Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(START)
        await send(body(b"a"))
        await send(body(b"b"))
        seen.append(list(transport.calls))  # nothing out yet: held for this turn
        await later.wait()
        await send(body(b"c"))
        await send(body(b"", more=False))

    proto, transport = connect(app)
    proto.data_received(GET)
    await until(lambda: len(transport.calls) == 1)
    assert seen == [[]]
    assert transport.calls == [response(b"a", b"b")[: -len(b"0\r\n\r\n")]]
    assert type(proto.cycle.transport) is not Cork  # released: the connection's again
    assert proto.held is None
    later.set()
    await until(lambda: len(transport.calls) == 3)
    assert transport.calls[1:] == [b"1\r\nc\r\n", b"0\r\n\r\n"]
    assert b"".join(transport.calls) == response(b"a", b"b", b"c")


@pytest.mark.parametrize("then", ["bad next request", "shutdown"])
async def test_what_is_held_goes_out_before_the_protocols_own_answer_or_close(then: str) -> None:
    ran = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        ran.set()  # the test's turn comes before the cork's release
        await send(START)
        await send(body(b"ok", more=False))

    proto, transport = connect(app)
    proto.data_received(GET)
    await ran.wait()
    assert proto.held is not None and transport.calls == []  # held, its release still due
    if then == "shutdown":
        proto.shutdown()  # the server stopping: closes connections idle after a response
    else:
        proto.data_received(b"\x01garbage\r\n\r\n")  # uvicorn answers 400 and closes
    assert transport.calls[0] == response(b"ok")
    assert transport.calls[-1] == "close"
    if then != "shutdown":
        assert transport.calls[1].startswith(b"HTTP/1.1 400 Bad Request\r\n")


async def test_a_close_writes_what_is_held_first() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(START)
        await send(body(b"ok", more=False))  # HTTP/1.0: uvicorn closes as it ends

    proto, transport = connect(app)
    proto.data_received(b"GET /x HTTP/1.0\r\n\r\n")
    await until(lambda: "close" in transport.calls)
    assert transport.calls == [response(b"ok", close=True), "close"]


async def test_a_client_gone_before_the_release_gets_nothing() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(START)
        await send(body(b"ok"))
        transport.closing = True  # the client left
        proto.connection_lost(None)

    proto, transport = connect(app)
    proto.data_received(GET)
    await until(lambda: proto.cycle.disconnected)
    await until(lambda: type(proto.cycle.transport) is not Cork)
    assert transport.calls == []
