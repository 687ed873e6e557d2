"""OpenTelemetry tracing of the worker, off by default (`--otlp-endpoint` or `OTEL_*`): a
`generation` span under the caller's `traceparent`, with `queue`, `prefill` and `decode`
children made from the generation's own timestamps after it ends, so nothing is added to
the token path."""

from __future__ import annotations

import logging
import time
from typing import Any

from sluice_common import otel
from sluice_common.contract import TRACE_CONTEXT_KEYS

log = logging.getLogger("sluice.worker")


_tracer: Any = None
_provider: Any = None


def setup(endpoint: str, service: str = "sluice-worker") -> bool:
    """Turn tracing on for `endpoint` (see `otel.endpoint_from_env`); False when it is ""."""
    global _tracer, _provider
    if not endpoint:
        return False
    _provider = otel.tracer_provider(endpoint, service)
    _tracer = _provider.get_tracer("sluice.worker")
    log.info("tracing on: OTLP to %s", endpoint)
    return True


def shutdown() -> None:
    """Flush and stop the exporter (the worker's shutdown)."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def headers(metadata: Any) -> dict[str, str] | None:
    """The caller's W3C trace context from gRPC metadata; None with tracing off or none sent."""
    if _tracer is None or not metadata:
        return None
    found = {k: v for k, v in metadata if k in TRACE_CONTEXT_KEYS and isinstance(v, str)}
    return found if "traceparent" in found else None


def record(trace_headers: dict[str, str], summary: dict[str, Any], arrived: float) -> None:
    """The generation's spans, from its summary (timings in seconds since `arrived`, a
    time.monotonic() reading)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    parent = otel.extract(trace_headers)
    # Monotonic seconds -> epoch nanoseconds, as the SDK's timestamps are.
    start = time.time_ns() - int((time.monotonic() - arrived) * 1e9)

    def at(seconds: float) -> int:
        return start + int(seconds * 1e9)

    queue, ttft, total = summary["queue_s"], summary["ttft_s"], summary["total_s"]
    span = _tracer.start_span(
        "generation",
        context=parent,
        kind=trace.SpanKind.SERVER,
        start_time=start,
        attributes={
            "sluice.request_id": summary["request_id"],
            "sluice.code": summary["code"],
            "sluice.finish_reason": summary["reason"],
            "gen_ai.usage.input_tokens": summary["prompt_tokens"],
            "gen_ai.usage.output_tokens": summary["completion_tokens"],
        },
    )
    if summary["code"] not in ("OK", "CANCELLED"):
        span.set_status(trace.StatusCode.ERROR, summary["code"])
    inner = trace.set_span_in_context(span)
    phases = [("queue", 0.0, queue), ("prefill", queue, ttft)]
    if summary["completion_tokens"]:
        phases.append(("decode", ttft, total))
    for name, begin, end in phases:
        child = _tracer.start_span(name, context=inner, start_time=at(begin))
        child.end(end_time=at(max(begin, end)))
    span.end(end_time=at(total))
