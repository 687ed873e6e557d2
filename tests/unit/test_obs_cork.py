"""`cork`: what a response writes in the loop turn it starts in reaches the connection as
one write, byte for byte what uvicorn's `send` writes unheld; later writes go straight
out; a close writes what is held first; a connection already closing gets nothing. Over
a real uvicorn httptools cycle and `ObsMiddleware`, on a transport that records calls."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from edge.obs.cork import Cork
from edge.obs.metrics import Metrics
from edge.obs.record import ObsMiddleware

START = {"type": "http.response.start", "status": 200, "headers": [(b"x-a", b"b")]}


class Transport:
    def __init__(self) -> None:
        self.calls: list[Any] = []  # bytes written, "close"
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(data)

    def close(self) -> None:
        self.calls.append("close")
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def cycle(keep_alive: bool = True) -> tuple[RequestResponseCycle, Transport]:
    transport = Transport()
    t: Any = transport
    log = logging.getLogger("test")
    scope: Any = {"type": "http", "method": "GET", "http_version": "1.1", "path": "/x"}
    c = RequestResponseCycle(
        scope,
        t,
        FlowControl(t),
        log,
        log,
        False,
        [],
        asyncio.Event(),
        False,
        keep_alive,
        lambda: None,
    )
    return c, transport


def body(data: bytes, more: bool = True) -> Any:
    return {"type": "http.response.body", "body": data, "more_body": more}


async def serve(c: RequestResponseCycle, app: Any) -> None:
    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    await ObsMiddleware(app, Metrics(), ["/x"], access_log=False)(c.scope, receive, c.send)


async def plain(messages: list[Any]) -> bytes:
    """What uvicorn's own `send` writes for `messages`, all together."""
    c, transport = cycle()
    for m in messages:
        await c.send(m)
    return b"".join(transport.calls)


async def test_a_turns_writes_go_out_as_one_then_the_rest_straight() -> None:
    c, transport = cycle()
    later = asyncio.Event()
    first = [START, body(b"data: a\n\n"), body(b"data: b\n\n")]
    rest = [body(b"data: c\n\n"), body(b"", more=False)]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        for m in first:
            await send(m)
        assert transport.calls == []  # held for this turn
        await later.wait()
        for m in rest:
            await send(m)

    task = asyncio.create_task(serve(c, app))
    while not transport.calls:
        await asyncio.sleep(0)
    assert transport.calls == [await plain(first)]
    assert type(c.transport) is not Cork  # released: the connection is the cycle's again
    later.set()
    await task
    assert transport.calls[1:] == [b"9\r\ndata: c\n\n\r\n", b"0\r\n\r\n"]
    assert b"".join(transport.calls) == await plain(first + rest)


async def test_a_close_writes_what_is_held_first() -> None:
    c, transport = cycle(keep_alive=False)  # uvicorn closes as the last byte goes out
    messages = [START, body(b"data: a\n\n"), body(b"", more=False)]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        for m in messages:
            await send(m)

    await serve(c, app)
    expected = (await plain(messages)).replace(b"x-a: b\r\n", b"x-a: b\r\nconnection: close\r\n")
    assert transport.calls == [expected, "close"]
    await asyncio.sleep(0)  # the release's turn: nothing more
    assert transport.calls == [expected, "close"]


async def test_a_connection_closing_before_the_release_gets_nothing() -> None:
    c, transport = cycle()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(START)
        await send(body(b"data: a\n\n"))
        transport.closing = True  # the client left

    await serve(c, app)
    await asyncio.sleep(0)
    assert transport.calls == []
