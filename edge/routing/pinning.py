"""Version pinning (`Pinning.place`): a session is placed once by the pools' weights, then
stays on its pool until that drains, is rolled back or removed, or has no worker left for
it. A new cookie session's id is drawn so that rendezvous maps it to the worker load
chose. Pins live in the cookie, or in a `SessionStore` (`MemoryPins` in this process)."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import cachetools

from edge.errors import ApiError
from edge.obs.prom import Exposition, labels
from edge.routing.prefix import Prompt
from edge.routing.registry import PoolRegistry
from edge.routing.scores import hrw
from edge.upstream.worker import Worker

log = logging.getLogger("sluice.edge")
# Ids drawn at most to map a new session onto its first worker: bounds the hashing to
# about this many scores (a pool of n workers matches within n draws on average).
MATCH_BUDGET = 64


class SessionStore(Protocol):
    """Where header and `user` sessions keep their pool (the cookie carries its own)."""

    async def get(self, key: str) -> str | None:
        """The pool `key` is pinned to (None: a new session); refreshes its lifetime."""
        ...

    async def put(self, key: str, pool: str) -> None:
        """Pin `key` to `pool` for the session lifetime."""
        ...


class MemoryPins:
    """`SessionStore` in this process: at most `max_entries`, least recently used out
    first, each entry living `ttl_s` from its last use."""

    def __init__(
        self, ttl_s: float, max_entries: int, timer: Callable[[], float] = time.monotonic
    ) -> None:
        self._pins: cachetools.TTLCache[str, str] = cachetools.TTLCache(max_entries, ttl_s, timer)

    async def get(self, key: str) -> str | None:
        pool = self._pins.get(key)
        if pool is not None:
            self._pins[key] = pool  # sliding: a used session lives on
        return pool

    async def put(self, key: str, pool: str) -> None:
        self._pins[key] = pool

    def __len__(self) -> int:
        return len(self._pins)


@dataclass(slots=True)
class Assignment:
    """Where a request goes and what that did to its session."""

    worker: Worker
    key: str  # the session key (a new cookie session's id is made here)
    new: bool = False  # placed by weights now (a new session, or a moved one)
    moved_from: str = ""  # the pool it was pinned to, when it had to move
    reason: str = ""  # why: "drained", "rolled_back", "removed", "unavailable"

    @property
    def pool(self) -> str:
        return self.worker.pool


class Pinning:
    """Places requests on pools and keeps sessions there (see the module docstring)."""

    def __init__(self, registry: PoolRegistry, store: SessionStore) -> None:
        self.registry = registry
        self.store = store
        self.moves: dict[str, int] = {}  # by reason, for /metrics

    async def place(
        self, model: str, key: str, pinned: str | None = None, prompt: Prompt | None = None
    ) -> Assignment:
        """A worker for a request of session `key` ("" = none yet: a new cookie session,
        whose id is made here). `pinned`: the pool its cookie names; None: ask the store.
        Raises ApiError as `PoolRegistry.pick` does."""
        registry = self.registry
        from_store = pinned is None
        if from_store and key:
            pinned = await self.store.get(key)
        reason = ""
        if pinned:
            reason = registry.refuses_pin(pinned)
            if not reason:
                try:
                    return Assignment(registry.pick(model, key, pool=pinned, prompt=prompt), key)
                except ApiError:
                    reason = "unavailable"  # nothing left there for it: move on
            self.moves[reason] = self.moves.get(reason, 0) + 1
            log.debug("session moves off pool %s (%s)", pinned, reason)
        if key:
            worker = registry.pick(model, key, prompt=prompt)
            if from_store:
                await self.store.put(key, worker.pool)
        else:  # a new cookie session: the cookie carries its pool, the store keeps nothing
            worker = registry.pick(model, prompt=prompt)
            key = self._session_id(worker, model)
        return Assignment(worker, key, True, (pinned or "") if reason else "", reason)

    def render_metrics(self) -> str:
        out = Exposition()
        out.family(
            "sluice_edge_session_moves_total",
            "counter",
            "Pinned sessions that had to leave their pool, by why (drained, rolled_back, ...).",
            [(labels(reason=r), n) for r, n in sorted(self.moves.items())],
        )
        return out.text()

    def _session_id(self, worker: Worker, model: str) -> str:
        """A fresh id that rendezvous maps to `worker` (best effort: MATCH_BUDGET)."""
        candidates = self.registry.candidates(worker.pool, model)
        tries = max(1, MATCH_BUDGET // max(1, len(candidates)))
        sid = secrets.token_urlsafe(16)
        if worker not in candidates:
            return sid
        for _ in range(tries):
            if hrw(sid, candidates, lambda w: w.address) is worker:
                break
            sid = secrets.token_urlsafe(16)
        return sid
