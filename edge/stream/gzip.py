"""Gzip for a stream's body when the client accepts it (`--sse-gzip`): every write flushed
on its own (`Z_SYNC_FLUSH`), so each event can be read the moment it arrives. A 1 KiB
window holds the last event, which is what a token event repeats: ~22 bytes on the wire
instead of ~320, for ~8 µs of edge CPU and ~12 KiB a stream (BENCHMARKS.md, round 5)."""

from __future__ import annotations

import zlib

from starlette.types import Scope

LEVEL, WINDOW_BITS, MEM_LEVEL = 1, 10, 2
CONTENT_ENCODING, VARY = (b"content-encoding", b"gzip"), (b"vary", b"accept-encoding")


def accepts_gzip(scope: Scope) -> bool:
    """The request's Accept-Encoding allows gzip (by name or `*`, q > 0)."""
    named: float | None = None
    star: float | None = None
    for key, value in scope.get("headers", ()):
        if key != b"accept-encoding":
            continue
        for item in value.decode("latin-1").split(","):
            coding, _, params = item.partition(";")
            coding = coding.strip().lower()
            q = _quality(params)
            if coding in ("gzip", "x-gzip"):
                named = q if named is None else max(named, q)
            elif coding == "*":
                star = q if star is None else max(star, q)
    if named is not None:
        return named > 0
    return star is not None and star > 0


def _quality(params: str) -> float:
    """The `q=` of one coding's parameters (1 when absent, 0 when malformed)."""
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return 0.0
            return q if 0.0 <= q <= 1.0 else 0.0
    return 1.0


class Gzip:
    """One response's compressor: `chunk` for each write, `last` for the final one."""

    __slots__ = ("_z",)

    def __init__(self) -> None:
        self._z = zlib.compressobj(LEVEL, zlib.DEFLATED, 16 + WINDOW_BITS, MEM_LEVEL)

    def chunk(self, data: bytes) -> bytes:
        z = self._z
        return z.compress(data) + z.flush(zlib.Z_SYNC_FLUSH)

    def last(self, data: bytes) -> bytes:
        z = self._z
        return z.compress(data) + z.flush(zlib.Z_FINISH)
