"""Prometheus metrics of the worker (`sluice_worker_*`, names and help in `_Collector`) on
`--metrics-port`. What the hot path updates is plain numbers and lock-free histograms
owned here; gauges and totals come from the core's `WorkerFigures` at scrape time only,
among them the autoscaling signals: queue depth, running, waiting, KV use, tokens/s."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from model_service.types import WorkerFigures
from sluice_common.histogram import Histogram

PREFIX = "sluice_worker_"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
RATE_WINDOW_S = 10.0  # tokens/s is over about this long (scrapes are its samples)


class Rate:
    """A counter's recent rate from the values it had at scrapes: over the last
    `window_s` (and the sample before it). Scrapes run in the HTTP server's threads,
    so a lock; the hot path never comes here."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._samples: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def __call__(self, value: int) -> float:
        with self._lock:
            now, samples = self.clock(), self._samples
            samples.append((now, value))
            while len(samples) > 2 and samples[1][0] <= now - self.window_s:
                samples.popleft()
            t0, v0 = samples[0]
            return max(0.0, (value - v0) / (now - t0)) if now > t0 else 0.0


class WorkerMetrics:
    """All worker metrics, in a registry of their own (tests may run several workers)."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}  # by final gRPC code name
        self.embeds: dict[str, int] = {}  # `Embed` batches, by gRPC code name
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.ttft = Histogram(LATENCY_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)  # observed by generations, per token chunk
        self.queue = Histogram(LATENCY_BUCKETS)
        self.e2e = Histogram(LATENCY_BUCKETS)
        self.figures: Callable[[], WorkerFigures] | None = None
        self.tokens_per_s = Rate(RATE_WINDOW_S)
        self.registry = CollectorRegistry()
        self.registry.register(_Collector(self))

    def refused(self, code: str) -> None:
        """A start that never became a generation."""
        self.requests[code] = self.requests.get(code, 0) + 1

    def ended(
        self,
        code: str,
        prompt_tokens: int,
        completion_tokens: int,
        timing_s: tuple[float, float, float],
    ) -> None:
        """A generation ended; timing_s = (queue, time to first token, total)."""
        self.requests[code] = self.requests.get(code, 0) + 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        queue_s, ttft_s, total_s = timing_s
        if completion_tokens:
            self.ttft.observe(ttft_s)
        self.queue.observe(queue_s)
        self.e2e.observe(total_s)

    def embedded(self, code: str, prompt_tokens: int) -> None:
        """An `Embed` batch ended with `code`."""
        self.embeds[code] = self.embeds.get(code, 0) + 1
        self.prompt_tokens += prompt_tokens

    def watch(self, figures: Callable[[], WorkerFigures]) -> None:
        """Report the gauges and totals of `figures()`, called at scrape time."""
        self.figures = figures

    def serve(self, host: str, port: int) -> int:
        """Serve /metrics in a background thread; returns the bound port."""
        httpd, _ = start_http_server(port, addr=host, registry=self.registry)
        return int(httpd.server_port)


def _histogram(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
    buckets, total = h.cumulative()
    return HistogramMetricFamily(
        PREFIX + name,
        doc,
        buckets=[(floatToGoString(bound), n) for bound, n in buckets],
        sum_value=total,
    )


class _Collector(Collector):
    def __init__(self, metrics: WorkerMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.m
        requests = CounterMetricFamily(
            PREFIX + "requests", "Generations by final gRPC status code", labels=["code"]
        )
        for code, n in sorted(m.requests.items()):
            requests.add_metric([code], n)
        yield requests
        embeds = CounterMetricFamily(
            PREFIX + "embed_requests", "Embed batches by gRPC status code", labels=["code"]
        )
        for code, n in sorted(m.embeds.items()):
            embeds.add_metric([code], n)
        yield embeds
        yield CounterMetricFamily(
            PREFIX + "prompt_tokens",
            "Prompt tokens processed (generations, embeddings)",
            value=m.prompt_tokens,
        )
        yield CounterMetricFamily(
            PREFIX + "generation_tokens", "Tokens generated", value=m.completion_tokens
        )
        yield _histogram("time_to_first_token_seconds", "Arrival to first token", m.ttft)
        yield _histogram("inter_token_latency_seconds", "Time between token chunks", m.itl)
        yield _histogram("queue_time_seconds", "Arrival to the start of prefill", m.queue)
        yield _histogram("request_duration_seconds", "Arrival to the final message", m.e2e)
        if m.figures is not None:
            yield from _live(m.figures(), m.tokens_per_s(m.completion_tokens))


def _live(f: WorkerFigures, tokens_per_s: float) -> Iterator[Metric]:
    stats = f.engine
    gauges = {
        # What an autoscaler acts on (KEDA, an HPA on external metrics): scrape-time values.
        "queue_depth": (
            "Generations admitted and not decoding yet: the worker's queue and the engine's",
            f.queued + (stats.waiting if stats else 0),
        ),
        "generation_tokens_per_second": (
            f"Tokens generated per second, over the last ~{RATE_WINDOW_S:g} s of scrapes",
            tokens_per_s,
        ),
        "running_requests": ("Generations being decoded", stats and stats.running),
        "waiting_requests": ("Generations waiting for a slot", stats and stats.waiting),
        "kv_cache_usage_ratio": ("KV cache in use, 0..1", stats and stats.kv_cache_usage),
        "in_flight_requests": ("Admitted generations", f.in_flight),
        "queued_requests": ("Admitted generations waiting for a batch slot", f.queued),
        "replay_bytes": ("Approximate replay log size", f.replay_bytes),
        "draining": ("1 while draining", int(f.draining)),
        "ready": ("1 once the engine is ready", int(f.ready)),
    }
    for name, (doc, value) in gauges.items():
        yield GaugeMetricFamily(PREFIX + name, doc, value=float(value or 0))
    counters = {
        "admission_rejections": ("Generations refused for overload", f.rejected_total),
        "displaced": (
            "Queued generations refused for a higher class or a fairer share",
            f.displaced_total,
        ),
        "resumes": ("Resume calls attached to a generation", f.resumed_total),
        "detach_expired": ("Detached generations aborted after grace", f.detach_expired_total),
        "wasted_tokens": (
            "Tokens generated while detached, never received",
            f.wasted_tokens_total,
        ),
    }
    for name, (doc, value) in counters.items():
        yield CounterMetricFamily(PREFIX + name, doc, value=float(value))
    if stats is not None and stats.spec_draft_tokens:
        yield CounterMetricFamily(
            PREFIX + "spec_draft_tokens", "Speculative draft tokens", value=stats.spec_draft_tokens
        )
        yield CounterMetricFamily(
            PREFIX + "spec_accepted_tokens",
            "Accepted draft tokens",
            value=stats.spec_accepted_tokens,
        )
