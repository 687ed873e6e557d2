"""Prometheus metrics of the worker, on their own HTTP port (`--metrics-port`).

Counters and histograms are updated as generations end (one observation per token for
inter-token latency); gauges of engine load are read from the engine at scrape time, so
the hot path pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from model_service.core import WorkerCore

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


class WorkerMetrics:
    """All worker metrics, in a registry of their own (tests may run several workers)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "sluice_worker_requests", "Generations by final gRPC status code", ["code"], registry=r
        )
        self.ttft = Histogram(
            "sluice_worker_time_to_first_token_seconds",
            "Arrival to first token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "sluice_worker_inter_token_latency_seconds",
            "Time between token chunks",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.queue = Histogram(
            "sluice_worker_queue_time_seconds",
            "Arrival to the start of prefill",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "sluice_worker_request_duration_seconds",
            "Arrival to the final message",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "sluice_worker_prompt_tokens", "Prompt tokens processed", registry=r
        )
        self.completion_tokens = Counter(
            "sluice_worker_generation_tokens", "Tokens generated", registry=r
        )

    def bind(self, core: WorkerCore) -> None:
        """Expose the core's live figures, read at scrape time."""
        self.registry.register(_CoreCollector(core))

    def serve(self, host: str, port: int) -> int:
        """Serve /metrics in a background thread; returns the bound port."""
        httpd, _ = start_http_server(port, addr=host, registry=self.registry)
        return int(httpd.server_port)


class _CoreCollector(Collector):
    def __init__(self, core: WorkerCore) -> None:
        self.core = core

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        core = self.core
        stats = core.engine.stats() if core.ready else None
        gauges = {
            "sluice_worker_running_requests": (
                "Generations being decoded",
                stats and stats.running,
            ),
            "sluice_worker_waiting_requests": (
                "Generations waiting for a slot",
                stats and stats.waiting,
            ),
            "sluice_worker_kv_cache_usage_ratio": (
                "KV cache in use, 0..1",
                stats and stats.kv_cache_usage,
            ),
            "sluice_worker_in_flight_requests": ("Admitted generations", core.admission.in_flight),
            "sluice_worker_replay_bytes": ("Approximate replay log size", core.store.bytes()),
            "sluice_worker_draining": ("1 while draining", int(core.draining)),
            "sluice_worker_ready": ("1 once the engine is ready", int(core.ready)),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=float(value or 0))
        counters = {
            "sluice_worker_admission_rejections": (
                "Generations refused for overload",
                core.admission.rejected_total,
            ),
            "sluice_worker_resumes": ("Resume calls attached to a generation", core.resumed_total),
            "sluice_worker_detach_expired": (
                "Detached generations aborted after grace",
                core.detach_expired_total,
            ),
            "sluice_worker_wasted_tokens": (
                "Tokens generated while detached, never received",
                core.wasted_tokens_total,
            ),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=float(value))
        if stats is not None and stats.spec_draft_tokens:
            yield CounterMetricFamily(
                "sluice_worker_spec_draft_tokens",
                "Speculative draft tokens",
                value=stats.spec_draft_tokens,
            )
            yield CounterMetricFamily(
                "sluice_worker_spec_accepted_tokens",
                "Accepted draft tokens",
                value=stats.spec_accepted_tokens,
            )
