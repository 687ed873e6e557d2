"""The replay log's index: which generations can still be resumed, under a memory cap.

Eviction rule: a generation is kept while it runs; once it ends, it stays resumable for
`retention_s`, unless the log is over `max_bytes`, in which case the generations that ended
first are dropped first. Running generations are never evicted: instead, while their
logs alone are over `max_bytes`, new generations are refused (`admit`: RESOURCE_EXHAUSTED,
retryable), so the cap bounds running logs too, to it plus what the running ones add
before they end (admission capacity x context window at most).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol

from model_service.errors import AlreadyExists, Overloaded

LIVE_RECOUNT_S = 0.1  # how stale the running logs' total may be when admitting

if TYPE_CHECKING:
    from collections.abc import Callable


class Replayable(Protocol):
    request_id: str
    ended: bool
    log_bytes: int


class ReplayStore:
    """Generations by request id: live ones, then ended ones in order of ending."""

    def __init__(
        self, retention_s: float, max_bytes: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.retention_s = retention_s
        self.max_bytes = max_bytes
        self._clock = clock
        self._live: dict[str, Replayable] = {}
        self._ended: OrderedDict[str, tuple[float, Replayable]] = OrderedDict()
        self._ended_bytes = 0  # running total: an ended log never changes
        self.evicted_total = 0
        self.refused_total = 0  # starts refused while running logs were over the cap
        self._live_bytes = 0
        self._live_counted_at = -LIVE_RECOUNT_S

    def add(self, gen: Replayable) -> None:
        """Register a new generation; a live one with the same id is a conflict."""
        rid = gen.request_id
        if rid in self._live:
            raise AlreadyExists(f"request_id {rid!r} is live already", field="request_id")
        old = self._ended.pop(rid, None)  # reusing a finished id replaces its log
        if old is not None:
            self._ended_bytes -= old[1].log_bytes
        self._live[rid] = gen

    def admit(self) -> None:
        """Raise Overloaded while the running generations' logs are over the cap."""
        now = self._clock()
        if now - self._live_counted_at >= LIVE_RECOUNT_S:  # a sum over live: not per start
            self._live_bytes = sum(g.log_bytes for g in self._live.values())
            self._live_counted_at = now
        if self._live_bytes > self.max_bytes:
            self.refused_total += 1
            raise Overloaded(
                f"the replay logs of running generations hold {self._live_bytes} bytes, over "
                f"this worker's --replay-max-mb; retry when some have ended",
                retry_after_s=1.0,
            )

    def ended(self, gen: Replayable) -> None:
        """Move a generation from live to retained, then evict what is due."""
        if self._live.get(gen.request_id) is gen:
            del self._live[gen.request_id]
            self._ended[gen.request_id] = (self._clock(), gen)
            self._ended_bytes += gen.log_bytes
        self.evict()

    def get(self, request_id: str) -> Replayable | None:
        self.evict()
        live = self._live.get(request_id)
        if live is not None:
            return live
        entry = self._ended.get(request_id)
        return entry[1] if entry else None

    def evict(self) -> None:
        """Drop ended generations past retention, then oldest-ended while over the cap."""
        horizon = self._clock() - self.retention_s
        total = self.bytes()
        while self._ended:
            rid, (ended_at, gen) = next(iter(self._ended.items()))
            if ended_at >= horizon and total <= self.max_bytes:
                break
            del self._ended[rid]
            total -= gen.log_bytes
            self._ended_bytes -= gen.log_bytes
            self.evicted_total += 1

    def bytes(self) -> int:
        """Live logs (bounded by admission) are summed; ended ones are a running total."""
        return self._ended_bytes + sum(g.log_bytes for g in self._live.values())

    def __len__(self) -> int:
        return len(self._live) + len(self._ended)
