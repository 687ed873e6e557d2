"""`cork`: what a response writes in the loop turn its start goes out in (the head, the
opening events, a short answer's tokens and end) held and written as one at the next
turn: one write syscall (and one TCP segment) where there were up to four, each ~8 µs of
CPU on loopback here. Applied by the one `send` wrapper (`edge.obs.record`) as a response
starts; everything the response writes later goes straight out."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Send
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle


class Cork(asyncio.Transport):
    """A cycle's transport while corked: writes held, the rest the connection's. Released
    (the held bytes written as one, the connection put back) at the next loop turn, or
    first by a `close`; bytes held for a connection already closing are dropped, as the
    connection's own `write` would."""

    __slots__ = ("_conn", "_cycle", "_held")

    def __init__(self, cycle: RequestResponseCycle, conn: asyncio.Transport) -> None:
        super().__init__()
        self._cycle, self._conn = cycle, conn
        self._held: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._held.append(bytes(data))

    def release(self) -> None:
        if self._cycle.transport is self:
            self._cycle.transport = self._conn
        held, self._held = self._held, []
        if held and not self._conn.is_closing():
            self._conn.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.release()
        self._conn.close()

    def is_closing(self) -> bool:
        return self._conn.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._conn.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._conn.get_write_buffer_size() + sum(map(len, self._held))


def cork(send: Send) -> None:
    """Hold what the response of `send` (uvicorn's httptools `send`; else nothing happens)
    writes from now to the end of this loop turn, then write it as one (`Cork`)."""
    cycle = getattr(send, "__self__", None)
    if type(cycle) is not RequestResponseCycle or type(cycle.transport) is Cork:
        return
    held = Cork(cycle, cycle.transport)
    cycle.transport = held
    asyncio.get_running_loop().call_soon(held.release)
