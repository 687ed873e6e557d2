"""Which generations can still be resumed, under a memory cap: running ones always; ended
ones for `retention_s`, those that ended first dropped first while over `max_bytes`. While
running logs alone are over the cap, new generations are refused (`admit`)."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol

from model_service.errors import AlreadyExists, Overloaded

if TYPE_CHECKING:
    from collections.abc import Callable


class Replayable(Protocol):
    request_id: str
    ended: bool

    @property
    def log_bytes(self) -> int:
        """Grows while live; the generation adds each growth to the store's `live_bytes`."""


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
        # Running total of the live logs: each live generation adds what it logs (it has
        # this store as its `generation.Ledger`), so no eviction sums over them all.
        self.live_bytes = 0
        self.evicted_total = 0
        self.refused_total = 0  # starts refused while running logs were over the cap

    def add(self, gen: Replayable) -> None:
        """Register a new generation; a live one with the same id is a conflict."""
        rid = gen.request_id
        if rid in self._live:
            raise AlreadyExists(f"request_id {rid!r} is live already", field="request_id")
        old = self._ended.pop(rid, None)  # reusing a finished id replaces its log
        if old is not None:
            self._ended_bytes -= old[1].log_bytes
        self._live[rid] = gen
        self.live_bytes += gen.log_bytes

    def admit(self) -> None:
        """Raise Overloaded while the running generations' logs are over the cap."""
        if self.live_bytes > self.max_bytes:
            self.refused_total += 1
            raise Overloaded(
                f"the replay logs of running generations hold {self.live_bytes} bytes, over "
                f"this worker's --replay-max-mb; retry when some have ended",
                retry_after_s=1.0,
            )

    def ended(self, gen: Replayable) -> None:
        """Move a generation from live to retained, then evict what is due."""
        if self._live.get(gen.request_id) is gen:
            del self._live[gen.request_id]
            self.live_bytes -= gen.log_bytes
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
        """Live and ended logs: two running totals."""
        return self._ended_bytes + self.live_bytes

    def __len__(self) -> int:
        return len(self._live) + len(self._ended)
