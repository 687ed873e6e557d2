"""`Wire`: a stream's body chunks written straight onto uvicorn's connection once its 200
went out: the chunk framing uvicorn's `send` writes, on the same transport, in order, the
bytes counted in the request's record, with no ASGI `send` coroutines per event. It
declines wherever that `send` would not simply write (the caller then uses `send`)."""

from __future__ import annotations

from starlette.types import Send
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from edge.obs.record import RequestRecord


class Wire:
    """`write` declines (False) when the client lags (flow control paused writing: `send`
    waits for it) or the body ended; `behind` gives none where the connection is not
    uvicorn's httptools one with a chunked body (h11, in-process test transports, a
    HEAD). A client that left gets nothing, as from `send`. The response's start and its
    last chunk (the `more_body: False` that completes the record) always go through
    `send`; with the audit log's bodies kept, the record has no raw send at all."""

    __slots__ = ("_cycle", "_rec")

    def __init__(self, cycle: RequestResponseCycle, rec: RequestRecord) -> None:
        self._cycle = cycle
        self._rec = rec

    @staticmethod
    def behind(rec: RequestRecord | None) -> Wire | None:
        """The record's connection, once its response started; None where `send` must
        carry every write."""
        raw: Send | None = rec.raw_send if rec is not None else None
        cycle = getattr(raw, "__self__", None)
        if type(cycle) is not RequestResponseCycle or rec is None:
            return None
        if not cycle.response_started or cycle.chunked_encoding is not True:
            return None
        if cycle.scope["method"] == "HEAD":
            return None
        return Wire(cycle, rec)

    def write(self, data: bytes) -> bool:
        """Write one body chunk now; False if `send` must carry it instead."""
        cycle = self._cycle
        if cycle.disconnected:
            return True  # what uvicorn's send does: nothing more goes out
        if cycle.flow.write_paused or cycle.response_complete:
            return False
        cycle.transport.write(b"%x\r\n%s\r\n" % (len(data), data))
        self._rec.bytes_sent += len(data)
        return True
