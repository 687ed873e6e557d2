"""Edge metrics in the Prometheus text exposition format, hand-written.

Kept dependency-free on purpose (prometheus_client is not a dependency of the project):
counters and gauges, each a dict keyed by its label values, and histograms
(`edge.histogram`). Values are per edge process; with `--processes N` each process reports
its own (see edge.histogram).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.routing import compile_path

from edge.histogram import ITL_BUCKETS, LATENCY_BUCKETS, OVERHEAD_BUCKETS, Histogram

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """The edge's counters and gauges."""

    def __init__(self) -> None:
        self.started = time.time()
        self.requests: defaultdict[tuple[str, int], int] = defaultdict(int)
        self.streams_in_flight = 0
        self.client_disconnects: defaultdict[str, int] = defaultdict(int)
        self.upstream_errors: defaultdict[str, int] = defaultdict(int)
        self.heartbeats = 0
        self.merged_chunks = 0
        # Streams (edge.stream): per SSE event, not per token or byte.
        self.ttft: defaultdict[str, Histogram] = defaultdict(lambda: Histogram(LATENCY_BUCKETS))
        self.inter_event = Histogram(ITL_BUCKETS)
        self.write_overhead = Histogram(OVERHEAD_BUCKETS)
        self.resumes: defaultdict[str, int] = defaultdict(int)
        # Security and limits (edge.auth, edge.limits), by reason.
        self.auth_failures: defaultdict[str, int] = defaultdict(int)
        self.admission_rejections: defaultdict[str, int] = defaultdict(int)
        # More exposition text from other parts (the pools' per-pool and per-worker lines).
        self.extra: list[Callable[[], str]] = []

    def render(self, workers_serving: int) -> bytes:
        """The exposition text."""
        lines: list[str] = []

        def family(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{name}{labels} {_number(value)}" for labels, value in samples)

        family(
            "sluice_edge_requests_total",
            "counter",
            "HTTP requests by route and status.",
            [(f'{{route="{r}",status="{s}"}}', v) for (r, s), v in sorted(self.requests.items())],
        )
        family(
            "sluice_edge_streams_in_flight",
            "gauge",
            "Generations being served now (streamed or not).",
            [("", self.streams_in_flight)],
        )
        family(
            "sluice_edge_client_disconnects_total",
            "counter",
            "Clients that went away before their generation ended.",
            [(f'{{route="{r}"}}', v) for r, v in sorted(self.client_disconnects.items())],
        )
        family(
            "sluice_edge_upstream_errors_total",
            "counter",
            "Generations the worker failed or refused, by error code.",
            [(f'{{code="{c}"}}', v) for c, v in sorted(self.upstream_errors.items())],
        )
        family(
            "sluice_edge_heartbeats_total",
            "counter",
            "SSE comment heartbeats sent.",
            [("", self.heartbeats)],
        )
        family(
            "sluice_edge_merged_chunks_total",
            "counter",
            "Upstream chunks merged into a larger event because the client read slowly.",
            [("", self.merged_chunks)],
        )

        def histogram(name: str, help_: str, series: list[tuple[str, Histogram]]) -> None:
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} histogram")
            for labels, h in series:
                lines.extend(h.samples(name, labels))

        histogram(
            "sluice_edge_time_to_first_token_seconds",
            "Request received to its first token event written (new streams only).",
            [(f'route="{r}"', h) for r, h in sorted(self.ttft.items())],
        )
        histogram(
            "sluice_edge_inter_token_latency_seconds",
            "Time between a stream's token events as written (an event may hold several).",
            [("", self.inter_event)],
        )
        histogram(
            "sluice_edge_write_overhead_seconds",
            "Per token event: its first gRPC message received to the SSE event written.",
            [("", self.write_overhead)],
        )
        family(
            "sluice_edge_resumes_total",
            "counter",
            "Streams continued from a Last-Event-ID, and stream links opened (GET /v1/streams).",
            [(f'{{via="{k}"}}', v) for k, v in sorted(self.resumes.items())],
        )
        family(
            "sluice_edge_admission_rejections_total",
            "counter",
            "Requests refused with 429 by the edge's per-key limits, by reason.",
            [(f'{{reason="{k}"}}', v) for k, v in sorted(self.admission_rejections.items())],
        )
        family(
            "sluice_edge_auth_failures_total",
            "counter",
            "Requests refused for a missing or invalid key.",
            [(f'{{reason="{k}"}}', v) for k, v in sorted(self.auth_failures.items())],
        )
        family(
            "sluice_edge_workers_serving",
            "gauge",
            "Workers reporting SERVING.",
            [("", workers_serving)],
        )
        family(
            "sluice_edge_start_time_seconds",
            "gauge",
            "Process start (Unix time).",
            [("", self.started)],
        )
        return ("\n".join(lines) + "\n" + "".join(f() for f in self.extra)).encode()


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


class MetricsMiddleware:
    """Counts every HTTP response by route and status (unknown paths share one label).

    Routes with parameters are counted under their template (`/v1/streams/{token}`), so
    labels stay few and capabilities never become label values. The label also goes into
    the scope (`sluice.route`) for the access log.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics, routes: frozenset[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = frozenset(r for r in routes if "{" not in r)
        self.templates = [(compile_path(r)[0], r) for r in sorted(routes) if "{" in r]

    def route(self, path: str) -> str:
        if path in self.routes:
            return path
        for regex, template in self.templates:
            if regex.match(path):
                return template
        return "other"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["sluice.route"] = self.route(scope["path"])

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests[(route, message["status"])] += 1
            await send(message)

        await self.app(scope, receive, counting_send)
