"""The bounded, merging hand-off between a stream's upstream reader and its HTTP writer.

The reader (`put_chunk`) never waits for the HTTP client unless the buffer is full; the
writer (`take`) gets everything pending at once, merged into one text delta. So a reader
that falls behind gets fewer, larger events instead of a growing queue, and memory per
stream stays under `max_bytes` (plus one upstream message): when that is reached the
upstream reader stops, and gRPC flow control holds the worker back.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from edge.errors import ApiError
from generated import sluice_pb2 as pb

# Rough bytes one logprob entry costs, for the bound (exactness does not matter).
LOGPROB_ENTRY_BYTES = 64
TOP_ENTRY_BYTES = 48


@dataclass(slots=True)
class Batch:
    """What the writer takes: merged deltas since the last take, and the end if it came."""

    text: str = ""
    logprobs: list[dict[str, Any]] | None = None
    chunks: int = 0  # upstream chunks merged into this batch
    cursor: int = 0  # upstream index the next message will have (for event ids)
    final: pb.Final | None = None
    error: ApiError | None = None
    rx_ns: int = 0  # perf_counter_ns when its first chunk arrived (write-overhead metric)
    stamp: int = 0  # worker_time_ns of its first chunk, when stamps were asked for

    @property
    def ended(self) -> bool:
        return self.final is not None or self.error is not None


@dataclass(slots=True)
class StreamBuffer:
    """See the module docstring. One producer, one consumer."""

    max_bytes: int = 256 * 1024
    merged_total: int = 0  # upstream chunks that shared an event with another one
    _text: list[str] = field(default_factory=list)
    _logprobs: list[dict[str, Any]] | None = None
    _size: int = 0
    _cursor: int = 0
    _final: pb.Final | None = None
    _error: ApiError | None = None
    _admitted: bool = False
    _rx_ns: int = 0
    _stamp: int = 0
    _ready: asyncio.Event = field(default_factory=asyncio.Event)
    _space: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._space.set()

    @property
    def cursor(self) -> int:
        return self._cursor

    @property
    def final_seen(self) -> bool:
        return self._final is not None

    @property
    def admitted(self) -> bool:
        """The worker took the generation (headers, a message or the end arrived)."""
        return self._admitted

    def admit(self) -> None:
        self._admitted = True
        self._ready.set()

    async def put_chunk(
        self, text: str, logprobs: list[dict[str, Any]] | None, index: int, stamp: int = 0
    ) -> None:
        """Add one upstream chunk; waits while the buffer is full."""
        while self._size >= self.max_bytes:
            self._space.clear()
            await self._space.wait()
        if not self._text:  # the first of the next batch: one clock read per event
            self._rx_ns = time.perf_counter_ns()
            self._stamp = stamp
        self._text.append(text)
        self._size += len(text)
        if logprobs is not None:
            if self._logprobs is None:
                self._logprobs = []
            self._logprobs.extend(logprobs)
            self._size += sum(
                LOGPROB_ENTRY_BYTES + TOP_ENTRY_BYTES * len(e["top_logprobs"]) for e in logprobs
            )
        self._cursor = index + 1
        self._admitted = True
        self._ready.set()

    def finish(self, final: pb.Final, index: int) -> None:
        """The upstream `final` message arrived."""
        self._final = final
        self._cursor = index + 1
        self._admitted = True
        self._ready.set()

    def fail(self, error: ApiError) -> None:
        """The upstream call failed; pending text is still delivered before the error."""
        if self._final is None and self._error is None:
            self._error = error
            self._ready.set()

    def pending(self) -> bool:
        return bool(self._text) or self._final is not None or self._error is not None

    async def wait_admitted(self, timeout: float | None) -> None:
        """Until admitted, data or the end is there, or `timeout` passes (no error)."""
        try:
            async with asyncio.timeout(timeout):
                while not (self._admitted or self._error is not None):
                    self._ready.clear()
                    await self._ready.wait()
        except TimeoutError:
            pass

    async def take(self, timeout: float | None = None) -> Batch | None:
        """Everything pending, merged; None if nothing came within `timeout`."""
        if not self.pending():
            try:
                async with asyncio.timeout(timeout):
                    while not self.pending():
                        self._ready.clear()
                        await self._ready.wait()
            except TimeoutError:
                return None
        n = len(self._text)
        batch = Batch(
            text=self._text[0] if n == 1 else "".join(self._text),
            logprobs=self._logprobs,
            chunks=n,
            cursor=self._cursor,
            final=self._final,
            error=self._error,
            rx_ns=self._rx_ns if n else 0,
            stamp=self._stamp if n else 0,
        )
        if n > 1:
            self.merged_total += n
        self._text = []
        self._logprobs = None
        self._size = 0
        self._ready.clear()
        self._space.set()
        return batch

    def error_before_data(self) -> ApiError | None:
        """The error if the call failed before any chunk (so an HTTP status is still possible)."""
        if self._error is not None and not self._text and self._cursor == 0:
            return self._error
        return None
