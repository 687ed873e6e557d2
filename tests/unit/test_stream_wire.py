"""`Wire`: body chunks written onto uvicorn's own httptools cycle (a real one, over a
transport that records what it is given) are byte for byte what uvicorn's `send` writes,
and it declines whenever that `send` would not simply write."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from edge.obs.record import RequestRecord
from edge.stream.wire import Wire

START = {"type": "http.response.start", "status": 200, "headers": [(b"x-a", b"b")]}


class Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def cycle(method: str = "GET") -> tuple[RequestResponseCycle, Transport]:
    transport = Transport()
    t: Any = transport
    log = logging.getLogger("test")
    scope: Any = {"type": "http", "method": method, "http_version": "1.1"}
    c = RequestResponseCycle(
        scope, t, FlowControl(t), log, log, False, [], asyncio.Event(), False, True, lambda: None
    )
    return c, transport


def body(data: bytes, more: bool = True) -> Any:
    return {"type": "http.response.body", "body": data, "more_body": more}


async def test_the_wire_writes_what_uvicorns_send_writes() -> None:
    ours, theirs = cycle(), cycle()
    rec = RequestRecord(route="/x", raw_send=ours[0].send)
    assert Wire.behind(rec) is None  # nothing started yet: `send` writes the head
    await ours[0].send(START)
    await theirs[0].send(START)
    wire = Wire.behind(rec)
    assert wire is not None
    for chunk in (b"data: a\n\n", b"data: \xc3\xa9\n\n" * 40):
        assert wire.write(chunk)
        await theirs[0].send(body(chunk))
    await ours[0].send(body(b"", more=False))
    await theirs[0].send(body(b"", more=False))
    assert ours[1].written == theirs[1].written
    assert rec.bytes_sent == 9 + 10 * 40
    assert not wire.write(b"late")  # the body ended: `send` decides (it raises)


async def test_the_wire_declines_while_the_client_lags_and_drops_after_it_left() -> None:
    c, transport = cycle()
    rec = RequestRecord(route="/x", raw_send=c.send)
    await c.send(START)
    wire = Wire.behind(rec)
    assert wire is not None
    c.flow.pause_writing()
    assert not wire.write(b"a")  # `send` waits for the client
    c.flow.resume_writing()
    c.disconnected = True
    assert wire.write(b"b")  # gone: nothing more goes out, as from `send`
    assert transport.written[1:] == []


async def test_no_wire_where_send_must_carry_every_write() -> None:
    head, _ = cycle("HEAD")
    await head.send(START)
    sized, _ = cycle()
    await sized.send({**START, "headers": [(b"content-length", b"3")]})

    async def wrapped(message: Any) -> None: ...

    for rec in (
        RequestRecord(route="/x", raw_send=head.send),
        RequestRecord(route="/x", raw_send=sized.send),
        RequestRecord(route="/x", raw_send=wrapped),
        RequestRecord(route="/x"),
    ):
        assert Wire.behind(rec) is None
    assert Wire.behind(None) is None
