"""A worker's prefix cache as its `WatchCache` stream tells this edge (`kv_aware` pools):
block hashes (at most `cap`, oldest out) and how they are named (`layout`). The stream
ending (the worker died or restarted) or a sequence gap drops them at once; a snapshot
replaces them. A worker without events is asked again now and then."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from sluice_common import blocks

log = logging.getLogger("sluice.edge")

BACKOFF_S = (0.05, 2.0)  # first and longest wait between attempts
NO_EVENTS_RETRY_S = 10.0  # a worker that publishes no events is asked again after this
BYTES_PER_BLOCK = 80  # a held hash in a dict (int object + slot), for the memory figure
_NO_EVENTS = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED)


class CacheFeed:
    """One worker's cache as its events tell (module docstring)."""

    def __init__(self, key: str, stub: pb_grpc.GenerationStub, cap: int) -> None:
        self.key = key
        self.cap = cap
        self.held: dict[int, None] = {}
        self.layout: pb.CacheLayout | None = None
        self.naming: tuple[int, bytes] | None = None  # (block size, seed) while live
        self.live = False
        self.epoch = 0  # counts the snapshots taken: what is held now began at the last
        self.events = 0  # messages applied
        self.resets = 0  # times what was held was dropped (stream ended, gap)
        self._stub = stub
        self._next_seq = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def block_size(self) -> int:
        return self.layout.block_size if self.layout is not None else 0

    def follow(self, serving: Callable[[], asyncio.Event]) -> None:
        """Start following the worker's events (once; `serving` gates each attempt)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(serving()), name=f"cache {self.key}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.reset()

    def reset(self) -> None:
        """Nothing is known to be held."""
        if self.held or self.live:
            self.resets += 1
        self.held = {}
        self.live = False
        self.naming = None

    async def _run(self, serving: asyncio.Event) -> None:
        backoff = BACKOFF_S[0]
        while True:
            await serving.wait()
            self._next_seq = 0
            wait = backoff
            try:
                async for msg in self._stub.WatchCache(pb.WatchCacheRequest()):
                    if not self.apply(msg):
                        break
                    backoff = BACKOFF_S[0]
            except grpc.aio.AioRpcError as err:
                if err.code() in _NO_EVENTS:
                    log.info("worker %s publishes no cache events: %s", self.key, err.details())
                    wait = NO_EVENTS_RETRY_S
                else:
                    log.debug("cache events of %s failed: %s", self.key, err.code().name)
            self.reset()
            await asyncio.sleep(wait)
            backoff = min(backoff * 2, BACKOFF_S[1])

    def apply(self, msg: pb.CacheEvents) -> bool:
        """One message of the stream; False on a gap (the caller reconnects)."""
        if msg.seq != self._next_seq:
            log.warning("cache events of %s: gap at %d (got %d)", self.key, self._next_seq, msg.seq)
            return False
        self._next_seq += 1
        self.events += 1
        if msg.snapshot:
            self.layout = msg.layout
            self.held = dict.fromkeys(msg.stored)
            self.epoch += 1
            self.live = msg.layout.hash_algo == blocks.ALGO and msg.layout.block_size > 0
            self.naming = (msg.layout.block_size, msg.layout.hash_seed) if self.live else None
        elif self.layout is None:
            return False  # changes before any snapshot: the stream is not ours
        else:
            held = self.held
            for h in msg.removed:
                held.pop(h, None)
            for h in msg.stored:
                held.pop(h, None)
                held[h] = None
        blocks.trim(self.held, self.cap)
        return True

    def describe(self) -> dict[str, object]:
        """For the admin API: what is held and what it costs."""
        lay = self.layout
        return {
            "live": self.live,
            "blocks": len(self.held),
            "bytes": len(self.held) * BYTES_PER_BLOCK,
            "block_size": lay.block_size if lay is not None else None,
            "instance": lay.instance if lay is not None else None,
            "events": self.events,
            "resets": self.resets,
        }
