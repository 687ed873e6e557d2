"""Admission control: refuse fast with a retry hint instead of queueing without bound."""

from __future__ import annotations

import time
from collections import deque

from model_service.config import AdmissionConfig
from model_service.errors import Overloaded
from model_service.types import EngineStats

RATE_WINDOW_S = 10.0
MIN_RETRY_S = 0.05
MAX_RETRY_S = 30.0


class DrainRate:
    """Generations finished per second over a trailing window."""

    def __init__(self, window_s: float = RATE_WINDOW_S, clock=time.monotonic) -> None:  # type: ignore[no-untyped-def]
        self._window = window_s
        self._clock = clock
        self._started = clock()
        self._stamps: deque[float] = deque()

    def record(self) -> None:
        self._stamps.append(self._clock())

    def rate(self) -> float:
        now = self._clock()
        while self._stamps and self._stamps[0] < now - self._window:
            self._stamps.popleft()
        span = min(self._window, max(now - self._started, 1e-3))
        return len(self._stamps) / span


class Admission:
    """Counts admitted generations; refuses past batch slots + waiting room or a full KV cache.

    Counting here rather than reading the engine's queue makes a burst of simultaneous
    arrivals race-free: each admission is decided against all those before it.
    """

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self.in_flight = 0
        self.finished_total = 0
        self.rejected_total = 0
        self.drain = DrainRate()

    def admit(self, stats: EngineStats) -> None:
        """Take one slot or raise Overloaded with a retry hint from the drain rate."""
        capacity = stats.max_running + self.config.max_waiting
        kv_full = stats.kv_cache_usage >= self.config.kv_high_watermark and stats.waiting > 0
        if self.in_flight >= capacity or kv_full:
            self.rejected_total += 1
            ahead = max(1, self.in_flight - stats.max_running + 1)
            retry = self.retry_after_s(ahead)
            why = "KV cache is full" if kv_full else f"{self.in_flight} generations in flight"
            raise Overloaded(
                f"worker overloaded ({why}); retry in {retry:.2f}s", retry_after_s=retry
            )
        self.in_flight += 1

    def unadmit(self) -> None:
        """Give back a slot taken by a start that never became a generation."""
        self.in_flight -= 1

    def release(self) -> None:
        """One admitted generation ended (any reason)."""
        self.in_flight -= 1
        self.finished_total += 1
        self.drain.record()

    def retry_after_s(self, ahead: int) -> float:
        """Time for `ahead` generations to drain at the recent rate."""
        rate = self.drain.rate()
        if rate <= 0:
            return 1.0
        return min(MAX_RETRY_S, max(MIN_RETRY_S, ahead / rate))
