"""The edge's own counters and histograms (`/metrics`), per process (`edge.obs.multiproc`
merges them). The hot path touches plain ints and `Histogram`s only: one `event_written`
per SSE event."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable

from edge.obs.histogram import ITL_BUCKETS, LATENCY_BUCKETS, OVERHEAD_BUCKETS
from edge.obs.prom import Exposition, labels
from sluice_common.histogram import Histogram


class Metrics:
    """The edge's counters and gauges (the pools add theirs through `extra`)."""

    def __init__(self) -> None:
        self.started = time.time()
        self.requests: defaultdict[tuple[str, int], int] = defaultdict(int)
        self.streams_in_flight = 0
        self.no_streams = asyncio.Event()  # set while streams_in_flight is 0 (drains wait)
        self.no_streams.set()
        self.client_disconnects: defaultdict[str, int] = defaultdict(int)
        self.upstream_errors: defaultdict[str, int] = defaultdict(int)
        self.heartbeats = 0
        self.merged_chunks = 0
        self.ttft: defaultdict[str, Histogram] = defaultdict(lambda: Histogram(LATENCY_BUCKETS))
        self.inter_event = Histogram(ITL_BUCKETS)
        self.write_overhead = Histogram(OVERHEAD_BUCKETS)
        self.resumes: defaultdict[str, int] = defaultdict(int)
        self.auth_failures: defaultdict[str, int] = defaultdict(int)
        self.admission_rejections: defaultdict[str, int] = defaultdict(int)
        # More exposition text from other parts (the pools' per-pool and per-worker lines).
        self.extra: list[Callable[[], str]] = []

    def stream_started(self) -> None:
        self.streams_in_flight += 1
        self.no_streams.clear()

    def stream_ended(self) -> None:
        self.streams_in_flight -= 1
        if not self.streams_in_flight:
            self.no_streams.set()

    def event_written(self, rx_ns: int, now_ns: int, previous_ns: int) -> None:
        """One token event written: `rx_ns` when its upstream message arrived, `previous_ns`
        when the stream's previous token event was written (0 for the first)."""
        self.write_overhead.observe((now_ns - rx_ns) * 1e-9)
        if previous_ns:
            self.inter_event.observe((now_ns - previous_ns) * 1e-9)

    def render(self, workers_serving: int) -> bytes:
        out = Exposition()
        out.family(
            "sluice_edge_requests_total",
            "counter",
            "HTTP requests by route and status.",
            ((labels(route=r, status=s), v) for (r, s), v in sorted(self.requests.items())),
        )
        out.family(
            "sluice_edge_streams_in_flight",
            "gauge",
            "Generations being served now (streamed or not).",
            [("", self.streams_in_flight)],
        )
        out.family(
            "sluice_edge_client_disconnects_total",
            "counter",
            "Clients that went away before their generation ended.",
            ((labels(route=r), v) for r, v in sorted(self.client_disconnects.items())),
        )
        out.family(
            "sluice_edge_upstream_errors_total",
            "counter",
            "Generations the worker failed or refused, by error code.",
            ((labels(code=c), v) for c, v in sorted(self.upstream_errors.items())),
        )
        out.family(
            "sluice_edge_heartbeats_total",
            "counter",
            "SSE heartbeats sent.",
            [("", self.heartbeats)],
        )
        out.family(
            "sluice_edge_merged_chunks_total",
            "counter",
            "Tokens that reached a client in an event with other tokens (merged because the "
            "client or the edge read slowly, or ready together at the worker).",
            [("", self.merged_chunks)],
        )
        out.histograms(
            "sluice_edge_time_to_first_token_seconds",
            "Request received to its first token event written (new streams only).",
            ((labels(route=r), h) for r, h in sorted(self.ttft.items())),
        )
        out.histograms(
            "sluice_edge_inter_token_latency_seconds",
            "Time between a stream's token events as written (an event may hold several).",
            [("", self.inter_event)],
        )
        out.histograms(
            "sluice_edge_write_overhead_seconds",
            "Per token event: its gRPC message received to the SSE event written.",
            [("", self.write_overhead)],
        )
        out.family(
            "sluice_edge_resumes_total",
            "counter",
            "Streams continued from a Last-Event-ID, and stream links opened (GET /v1/streams).",
            ((labels(via=k), v) for k, v in sorted(self.resumes.items())),
        )
        out.family(
            "sluice_edge_admission_rejections_total",
            "counter",
            "Requests refused with 429 by the edge's per-key limits, by reason.",
            ((labels(reason=k), v) for k, v in sorted(self.admission_rejections.items())),
        )
        out.family(
            "sluice_edge_auth_failures_total",
            "counter",
            "Requests refused for a missing or invalid key.",
            ((labels(reason=k), v) for k, v in sorted(self.auth_failures.items())),
        )
        out.family(
            "sluice_edge_workers_serving",
            "gauge",
            "Workers reporting SERVING.",
            [("", workers_serving)],
        )
        out.family(
            "sluice_edge_start_time_seconds",
            "gauge",
            "Process start (Unix time).",
            [("", self.started)],
        )
        return (out.text() + "".join(f() for f in self.extra)).encode()
