"""`tune_gc`: after start-up, what exists lives as long as the process, so the collector
stops scanning it (`gc.freeze`): a full collection of a worker's heap (vLLM, torch and
transformers imported: ~630,000 objects) held its loop ~380 ms, every stream with it.
Young collections run less often: each open stream allocates with every event. A
collection that still holds the process over `SLOW_PAUSE_S` is logged: every stream of
the process waited that long."""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

log = logging.getLogger("sluice.gc")

# At the default 700 allocations per young collection, thousands of streams keep the
# collector busy (BENCHMARKS.md, issue 11's target 3). A generation-1 collection scans
# what survived the young ones since the last: every second one here (at 20 of 50,000
# each, 20,000 streams opening made them 0.5-0.7 s; now at most ~0.14 s), and a full
# one waits for 200 of those (it scans the whole heap).
GC_THRESHOLDS = (20_000, 2, 200)
SLOW_PAUSE_S = 0.1


class _PauseClock:
    """A `gc.callbacks` entry: times each collection, logs the slow ones."""

    def __init__(self, slow_s: float) -> None:
        self.slow_s = slow_s
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        if took >= self.slow_s:
            log.warning(
                "gc pause: a generation-%d collection took %.0f ms (%d objects freed)",
                info["generation"],
                took * 1000,
                info["collected"],
            )


def tune_gc(slow_pause_s: float = SLOW_PAUSE_S) -> None:
    """Freeze what exists, set the thresholds, and from then on log collections of
    `slow_pause_s` or more (one clock per process: a later call sets its bound)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    for cb in gc.callbacks:
        if isinstance(cb, _PauseClock):
            cb.slow_s = slow_pause_s
            return
    gc.callbacks.append(_PauseClock(slow_pause_s))
