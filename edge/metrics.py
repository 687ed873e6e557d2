"""Edge metrics in the Prometheus text exposition format, hand-written.

Kept dependency-free on purpose (prometheus_client is not a dependency of the project):
a handful of counters and gauges, each a dict keyed by its label values. Values are per
edge process; with `--workers N` each process reports its own.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

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
        return ("\n".join(lines) + "\n").encode()


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


class MetricsMiddleware:
    """Counts every HTTP response by route and status (unknown paths share one label)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, routes: frozenset[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in self.routes else "other"

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests[(route, message["status"])] += 1
            await send(message)

        await self.app(scope, receive, counting_send)
