"""OpenTelemetry for the edge, off by default (on with `--otlp-endpoint` or
`OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`): `request`, `route` and `attempt` spans, the
attempt's `traceparent` sent to the worker. Off, every hook is one check of a module
global, and the token path has none."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

from sluice_common import otel

log = logging.getLogger("sluice.edge")

T = TypeVar("T")
TRACEPARENT = "traceparent"
# Probes and scrapes come every few seconds and say nothing about a request's time.
UNTRACED_ROUTES = frozenset(("/healthz", "/readyz", "/metrics"))

_tracer: Any = None  # an opentelemetry Tracer while tracing is on
_provider: Any = None


def setup(flag: str, service: str = "sluice-edge") -> bool:
    """Turn tracing on when an endpoint is configured (`sluice_common.otel`: the flag, else
    the OTEL_ variables, unless OTEL_SDK_DISABLED); spans go there by OTLP/gRPC in batches."""
    global _tracer, _provider
    endpoint = otel.endpoint_from_env(flag)
    if not endpoint:
        return False
    _provider = otel.tracer_provider(endpoint, service)
    _tracer = _provider.get_tracer("sluice.edge")
    log.info("tracing on: OTLP to %s", endpoint)
    return True


def shutdown() -> None:
    """Flush and stop the exporter (the edge's lifespan end)."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def enabled() -> bool:
    return _tracer is not None


# -- the request span (ObsMiddleware) --------------------------------------------------


def start_request(scope: MutableMapping[str, Any], route: str) -> tuple[Any, Any] | None:
    """A server span for the request, made current; None with tracing off (or a probe)."""
    if _tracer is None or route in UNTRACED_ROUTES:
        return None
    from opentelemetry import context, trace

    carrier: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        if name == b"traceparent" or name == b"tracestate":
            carrier[name.decode()] = value.decode("latin-1")
    parent = otel.extract(carrier) if carrier else None
    span = _tracer.start_span(
        "request",
        context=parent,
        kind=trace.SpanKind.SERVER,
        attributes={"http.request.method": scope.get("method", ""), "url.path": scope["path"]},
    )
    token = context.attach(trace.set_span_in_context(span))
    return span, token


def end_request(handle: tuple[Any, Any], status: int, route: str, request_id: str) -> None:
    from opentelemetry import context, trace

    span, token = handle
    span.set_attribute("http.route", route)
    span.set_attribute("http.response.status_code", status)
    if request_id:
        span.set_attribute("sluice.request_id", request_id)
    if status >= 500:
        span.set_status(trace.StatusCode.ERROR)
    span.end()
    context.detach(token)


# -- routing and attempts (api.generate, upstream.failover) ----------------------------


def route(pick: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`pick(*args, **kwargs)` inside a `route` span naming the worker it chose."""
    if _tracer is None:
        return pick(*args, **kwargs)
    with _tracer.start_as_current_span("route") as span:
        worker = pick(*args, **kwargs)
        span.set_attribute("sluice.worker", getattr(worker, "address", ""))
        span.set_attribute("sluice.pool", getattr(worker, "pool", ""))
        return worker


async def route_awaiting(placing: Awaitable[T]) -> T:
    """`await placing` (a pick: a worker, or a tuple starting with one) inside a `route`
    span naming the worker."""
    if _tracer is None:
        return await placing
    with _tracer.start_as_current_span("route") as span:
        result = await placing
        worker = result[0] if isinstance(result, tuple) else result
        span.set_attribute("sluice.worker", getattr(worker, "address", ""))
        span.set_attribute("sluice.pool", getattr(worker, "pool", ""))
        return result


def start_attempt(worker: str, pool: str, number: int, continuation: int) -> Any:
    """A client span for one upstream attempt; None with tracing off."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    return _tracer.start_span(
        "attempt",
        kind=trace.SpanKind.CLIENT,
        attributes={
            "sluice.worker": worker,
            "sluice.pool": pool,
            "sluice.attempt": number,
            "sluice.continuation": continuation,
            "rpc.system": "grpc",
            "rpc.method": "Generate",
        },
    )


def traceparent(span: Any) -> str:
    """The W3C traceparent naming `span`, for the worker's gRPC metadata."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(span))
    return carrier.get(TRACEPARENT, "")


def end_attempt(span: Any, outcome: str, tokens: int) -> None:
    from opentelemetry import trace

    span.set_attribute("sluice.outcome", outcome)
    span.set_attribute("sluice.tokens", tokens)
    if outcome not in ("ok", "cancelled"):
        span.set_status(trace.StatusCode.ERROR, outcome)
    span.end()
