"""`Cork`: a response's first loop turn of writes (head, opening events, a short answer's
end) written as one at the next turn: one write syscall where there were up to four (~8
µs each on loopback here). The edge's protocol (`edge.security.http_limits`), its only
user, gives each request one and writes what it holds before its own writes and closes."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle


class Holder(Protocol):
    """Who must write a cork's bytes before its own (the connection's protocol)."""

    held: Cork | None


class Cork(asyncio.Transport):
    """A cycle's transport until its first turn of writes is out, the connection's
    otherwise. `release` (the next loop turn, or first a `close`, or the protocol) writes
    the held bytes as one and puts the connection back; bytes held for a connection that
    the client closed are dropped, as the connection's own `write` would."""

    __slots__ = ("_conn", "_cycle", "_held", "_holder", "_loop")

    def __init__(
        self,
        cycle: RequestResponseCycle,
        conn: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        holder: Holder,
    ) -> None:
        super().__init__()
        self._cycle, self._conn, self._loop, self._holder = cycle, conn, loop, holder
        self._held: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._held:
            self._loop.call_soon(self.release)
            self._holder.held = self
        self._held.append(bytes(data))

    def release(self) -> None:
        if self._cycle.transport is self:
            self._cycle.transport = self._conn
        if self._holder.held is self:
            self._holder.held = None
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
