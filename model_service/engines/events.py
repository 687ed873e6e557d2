"""The blocks an engine's prefix cache holds, kept from the engine's own events (vLLM's
KV-cache events, the sim's cache) and handed to any number of readers (`WatchCache`):
each gets a snapshot, then the changes since, coalesced while it does not read. A reader
that falls more than `backlog` changes behind gets a new snapshot instead (its memory
stays bounded, whatever it does); so does every reader after `reset` (the engine's events
had a gap: what it holds is unknown, so it is taken as empty until events say more)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from sluice_common import blocks
from sluice_common.wakeup import Wakeup

DEFAULT_BACKLOG = 65_536  # changes a reader may have pending before it gets a snapshot


@dataclass(frozen=True, slots=True)
class Layout:
    """How the engine names its blocks (`sluice_common.blocks`); `instance` is new each
    time the cache starts empty."""

    block_size: int
    hash_algo: str
    hash_seed: bytes
    capacity_blocks: int
    instance: str = field(default_factory=lambda: secrets.token_hex(8))


@dataclass(frozen=True, slots=True)
class Batch:
    """What a reader gets: everything held (`snapshot`), or the changes since its last."""

    snapshot: bool
    stored: list[int]
    removed: list[int]


class Reader:
    """One reader's pending changes (latest per block wins: stored and removed disjoint)."""

    __slots__ = ("_log", "_removed", "_snapshot", "_stored", "wakeup")

    def __init__(self, log: CacheLog) -> None:
        self._log = log
        self._snapshot = True
        self._stored: dict[int, None] = {}
        self._removed: dict[int, None] = {}
        self.wakeup = Wakeup()

    def _store(self, hashes: list[int]) -> None:
        if self._snapshot:
            return
        for h in hashes:
            self._removed.pop(h, None)
            self._stored[h] = None
        self._check()

    def _remove(self, hashes: list[int]) -> None:
        if self._snapshot:
            return
        for h in hashes:
            self._stored.pop(h, None)
            self._removed[h] = None
        self._check()

    def _check(self) -> None:
        if len(self._stored) + len(self._removed) > self._log.backlog:
            self.resend()
        else:
            self.wakeup.set()

    def resend(self) -> None:
        """Send everything next instead of the changes."""
        self._snapshot = True
        self._stored.clear()
        self._removed.clear()
        self.wakeup.set()

    async def next(self) -> Batch:
        """The next batch, once there is one."""
        while not (self._snapshot or self._stored or self._removed):
            await self.wakeup.wait()
        if self._snapshot:
            self._snapshot = False
            return Batch(True, list(self._log.held), [])
        batch = Batch(False, list(self._stored), list(self._removed))
        self._stored.clear()
        self._removed.clear()
        return batch

    def close(self) -> None:
        self._log.readers.discard(self)


class CacheLog:
    """The engine's cache as its events tell it (module docstring). Engines call `stored`,
    `removed` and `reset`; `held` is bounded by the layout's capacity (oldest out)."""

    def __init__(self, layout: Layout, backlog: int = DEFAULT_BACKLOG) -> None:
        self.layout = layout
        self.backlog = backlog
        self.held: dict[int, None] = {}  # insertion order: oldest stored first
        self.readers: set[Reader] = set()
        self.gaps = 0  # resets after lost engine events

    def reader(self) -> Reader:
        reader = Reader(self)
        self.readers.add(reader)
        return reader

    def stored(self, hashes: list[int]) -> None:
        held = self.held
        for h in hashes:
            held.pop(h, None)
            held[h] = None
        cap = self.layout.capacity_blocks  # past it, events missed evictions: trust the newest
        dropped = blocks.trim(held, cap) if cap else []
        for r in self.readers:
            r._store(hashes)
            if dropped:
                r._remove(dropped)

    def removed(self, hashes: list[int]) -> None:
        held = self.held
        for h in hashes:
            held.pop(h, None)
        for r in self.readers:
            r._remove(hashes)

    def reset(self) -> None:
        """Nothing is known to be held (the cache was cleared, or events were lost)."""
        self.held.clear()
        for r in self.readers:
            r.resend()
