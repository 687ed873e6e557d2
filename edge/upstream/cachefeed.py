"""A worker's prefix cache as its `WatchCache` stream tells this edge (`kv_aware` pools):
block hashes (at most `cap`, oldest out) and how they are named (`layout`). The stream
ending (the worker died or restarted) or a sequence gap drops them at once; a snapshot
replaces them. A worker without events is asked again now and then. `Owners` (one per
process) turns every feed round for the walk: per hash, a bit per live feed holding it,
so a prompt's block is one probe whatever the number of workers."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice

import grpc

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from sluice_common import blocks

log = logging.getLogger("sluice.edge")

BACKOFF_S = (0.05, 2.0)  # first and longest wait between attempts
NO_EVENTS_RETRY_S = 10.0  # a worker that publishes no events is asked again after this
BYTES_PER_BLOCK = 116  # held (int + slot) and its `Owners` entry (tracemalloc, 262,144 blocks)
_NO_EVENTS = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED)


class Owners:
    """Per block hash, a bit mask of the live feeds that hold it (module docstring). A
    feed takes a bit when it goes live and gives it back when it resets; the bit is
    cleared from what it held `SWEEP` blocks per message applied (`sweep`: a full feed
    at once would stall the loop ~25 ms) and only then taken again. Until then it may
    linger on blocks, which no walk reads: a walk looks for live feeds' bits only."""

    SWEEP = 4096

    def __init__(self) -> None:
        self.masks: dict[int, int] = {}
        self._free: list[int] = []
        self._next = 0
        self._retiring: deque[tuple[int, Iterator[int]]] = deque()

    def take(self) -> int:
        if self._free:
            return self._free.pop()
        self._next += 1
        return 1 << (self._next - 1)

    def give(self, bit: int, held: Iterable[int]) -> None:
        """`bit`'s feed holds nothing any more (`held`: what it held, left unchanged)."""
        self._retiring.append((bit, iter(held)))

    def sweep(self, budget: int = SWEEP) -> None:
        """Clear up to `budget` blocks of given-back bits; a bit cleared is free again."""
        while budget > 0 and self._retiring:
            bit, rest = self._retiring[0]
            chunk = list(islice(rest, budget))
            self.drop(chunk, bit)
            if len(chunk) < budget:
                self._retiring.popleft()
                self._free.append(bit)
            budget -= len(chunk) + 1

    def add(self, hashes: Iterable[int], bit: int) -> None:
        masks = self.masks
        for h in hashes:
            masks[h] = masks.get(h, 0) | bit

    def drop(self, hashes: Iterable[int], bit: int) -> None:
        masks, keep = self.masks, ~bit
        for h in hashes:
            rest = masks.get(h, 0) & keep
            if rest:
                masks[h] = rest
            else:
                masks.pop(h, None)


OWNERS = Owners()


class CacheFeed:
    """One worker's cache as its events tell (module docstring)."""

    def __init__(
        self, key: str, stub: pb_grpc.GenerationStub, cap: int, owners: Owners = OWNERS
    ) -> None:
        self.key = key
        self.cap = cap
        self.owners = owners
        self.bit = 0  # its bit in `owners` while live (0: none)
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
        self._unown()
        self.held = {}
        self.live = False
        self.naming = None

    def _unown(self) -> None:
        if self.bit:
            self.owners.give(self.bit, self.held)
            self.bit = 0

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
        self.owners.sweep()
        if msg.snapshot:
            self._unown()
            self.layout = msg.layout
            self.held = dict.fromkeys(msg.stored)
            self.epoch += 1
            self.live = msg.layout.hash_algo == blocks.ALGO and msg.layout.block_size > 0
            self.naming = (msg.layout.block_size, msg.layout.hash_seed) if self.live else None
            blocks.trim(self.held, self.cap)
            if self.live:
                self.bit = self.owners.take()
                self.owners.add(self.held, self.bit)
            return True
        if self.layout is None:
            return False  # changes before any snapshot: the stream is not ours
        self.change(msg.stored, msg.removed)
        return True

    def change(self, stored: Sequence[int], removed: Sequence[int] = ()) -> None:
        """Blocks evicted, then blocks stored (a message's changes)."""
        held, bit = self.held, self.bit
        gone = [h for h in removed if held.pop(h, 0) is None]
        for h in stored:
            held.pop(h, None)
            held[h] = None
        trimmed = blocks.trim(held, self.cap)
        if bit:  # in the same order: a block removed, then stored again, stays held
            self.owners.drop(gone, bit)
            self.owners.add(stored, bit)
            self.owners.drop(trimmed, bit)

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
