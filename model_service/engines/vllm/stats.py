"""Engine load from vLLM's scheduler, through its stat-logger hook (`StatsCollector`
duck-types `StatLoggerBase`, so nothing here imports vLLM). Scheduler stats arrive only
with engine steps, so `snapshot()` reconciles them with the frontend's count of unfinished
requests, which changes at once."""

from __future__ import annotations

import threading
from typing import Any

from model_service.types import EngineStats


class StatsCollector:
    """A vLLM per-engine stat logger that remembers the latest scheduler figures."""

    def __init__(self, max_running: int) -> None:
        self.max_running = max_running
        self.kv_cache_tokens = 0  # the KV cache's capacity, once the engine knows it
        self._lock = threading.Lock()  # record() runs on the loop; stats() may not
        self._running = 0
        self._waiting = 0
        self._kv_cache_usage = 0.0
        self._spec_draft_tokens = 0
        self._spec_accepted_tokens = 0
        self._prefix_queries = 0
        self._prefix_hits = 0
        self._preemptions = 0
        self.steps = 0

    def factory(self, vllm_config: Any, engine_index: int = 0) -> StatsCollector:
        """vLLM's `PerEngineStatLoggerFactory` signature: (VllmConfig, engine index)."""
        return self

    # The StatLoggerBase interface.
    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        """Called by vLLM's output handler after each batch of engine-core outputs."""
        with self._lock:
            if iteration_stats is not None:
                self._preemptions += getattr(iteration_stats, "num_preempted_reqs", 0)
            if scheduler_stats is None:
                return
            self.steps += 1
            self._running = scheduler_stats.num_running_reqs
            self._waiting = scheduler_stats.num_waiting_reqs + getattr(
                scheduler_stats, "num_skipped_waiting_reqs", 0
            )
            self._kv_cache_usage = float(scheduler_stats.kv_cache_usage)
            spec = scheduler_stats.spec_decoding_stats
            if spec is not None:
                self._spec_draft_tokens += spec.num_draft_tokens
                self._spec_accepted_tokens += spec.num_accepted_tokens
            prefix = scheduler_stats.prefix_cache_stats
            if prefix is not None:
                self._prefix_queries += prefix.queries
                self._prefix_hits += prefix.hits

    def log(self) -> None:
        """vLLM calls this to print periodic stats; the worker reports them over gRPC instead."""

    def log_engine_initialized(self) -> None:
        """Nothing to log: the worker logs its own readiness."""

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        """Sleep mode is unused."""

    def snapshot(self, unfinished: int | None = None) -> EngineStats:
        """The latest figures; `unfinished` (the frontend's live request count) corrects lag.

        Requests the frontend holds but the scheduler has not reported yet count as
        waiting; once the frontend holds none, nothing runs or waits.
        """
        with self._lock:
            running, waiting = self._running, self._waiting
            if unfinished is not None:
                running = min(running, unfinished)
                waiting = max(unfinished - running, 0)
            return EngineStats(
                running=running,
                waiting=waiting,
                max_running=self.max_running,
                kv_cache_usage=self._kv_cache_usage if unfinished != 0 else 0.0,
                spec_draft_tokens=self._spec_draft_tokens,
                spec_accepted_tokens=self._spec_accepted_tokens,
                extra={
                    "prefix_cache_queries": float(self._prefix_queries),
                    "prefix_cache_hits": float(self._prefix_hits),
                    "preemptions": float(self._preemptions),
                    "steps": float(self.steps),
                    "kv_cache_tokens": float(self.kv_cache_tokens),
                },
            )
