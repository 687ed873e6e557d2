"""The load `WatchLoad` pushes: engine figures plus recent prefix-cache hit rate and
tokens/s. A stream samples every `min_s` and sends when a figure routing acts on changed,
or at least every `max_s` (a heartbeat): nothing is added to the token path."""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

from generated import sluice_pb2 as pb
from model_service.core import WorkerCore
from model_service.rpc import replies
from model_service.types import EngineStats, LoadFigures

DEFAULT_MIN_S = 0.05
DEFAULT_MAX_S = 1.0
FLOOR_S = 0.01  # a caller cannot make the worker sample more often than this
WINDOW_S = 5.0  # recent rates are over this long
SAMPLE_EVERY_S = 0.25  # a new window sample at most this often (all streams share them)


def intervals(min_ms: int, max_ms: int) -> tuple[float, float]:
    """A request's intervals in seconds, defaults and floor applied."""
    lo = max(FLOOR_S, min_ms / 1000 if min_ms else DEFAULT_MIN_S)
    hi = max(lo, max_ms / 1000 if max_ms else DEFAULT_MAX_S)
    return lo, hi


class LoadReporter:
    """The worker's load figures and their recent rates (see the module docstring)."""

    def __init__(self, core: WorkerCore, clock: Callable[[], float] = time.monotonic) -> None:
        self.core = core
        self._clock = clock
        # (time, tokens looked up, tokens found, tokens generated)
        self._samples: deque[tuple[float, int, int, int]] = deque()

    def figures(self) -> LoadFigures:
        core = self.core
        stats = core.engine.stats() if core.ready else EngineStats()
        extra = stats.extra
        queried = int(extra.get("prefix_cache_queries", 0))
        hits = int(extra.get("prefix_cache_hits", 0))
        generated = core.metrics.completion_tokens
        hit_rate, tps = self._rates(queried, hits, generated)
        return LoadFigures(
            running=stats.running,
            waiting=stats.waiting + core.admission.queued,  # the engine's and the worker's queue
            max_running=stats.max_running,
            kv_cache_usage=stats.kv_cache_usage,
            draining=core.draining,
            prefix_cache_hit_rate=hit_rate,
            tokens_per_s=tps,
            prefix_cache_queried_tokens=queried,
            prefix_cache_hit_tokens=hits,
            generated_tokens=generated,
            kv_cache_tokens=int(extra.get("kv_cache_tokens", 0)),
            models_version=core.adapters.version,
            active_adapters=core.adapters.active(),
        )

    def _rates(self, queried: int, hits: int, generated: int) -> tuple[float, float]:
        now = self._clock()
        samples = self._samples
        if not samples or now - samples[-1][0] >= SAMPLE_EVERY_S:
            samples.append((now, queried, hits, generated))
        while len(samples) > 1 and samples[1][0] <= now - WINDOW_S:
            samples.popleft()  # keep one sample at or before the window's start
        t0, q0, h0, g0 = samples[0]
        dq, dt = queried - q0, now - t0
        if dq > 0:
            hit_rate = (hits - h0) / dq
        else:
            hit_rate = hits / queried if queried else 0.0
        tps = (generated - g0) / dt if dt > 0 else 0.0
        return min(1.0, max(0.0, hit_rate)), max(0.0, tps)

    async def watch(self, min_s: float, max_s: float) -> AsyncIterator[pb.WorkerLoad]:
        """One stream's messages (module docstring), forever."""
        last_key: tuple[object, ...] | None = None
        last_sent = -math.inf
        seq = 0
        while True:
            figures = self.figures()
            key = figures.key()
            now = self._clock()
            if key != last_key or now - last_sent >= max_s - 1e-9:
                yield replies.load_to_pb(figures, seq)
                seq += 1
                last_key, last_sent = key, now
            await asyncio.sleep(min_s)
