"""OpenTelemetry set-up shared by the worker's and the edge's tracing (off by default).

Only what the two did alike: where spans go (`endpoint_from_env`), the exporting
provider (`tracer_provider`), and reading a W3C trace context (`extract`). The spans
themselves stay with each side (`edge/obs/tracing.py`, `model_service/obs/tracing.py`). The
SDK is imported inside the functions, so with tracing off nothing of it is loaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


def endpoint_from_env(flag: str) -> str:
    """The traces endpoint: the flag, else the standard OTLP variables; "" = tracing off."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return ""
    return (
        flag
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    )


def tracer_provider(endpoint: str, service: str) -> Any:
    """A TracerProvider naming `service` that sends its spans to the OTLP/gRPC `endpoint`
    in batches (the SDK's OTEL_BSP_* variables tune them)."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


def extract(carrier: Mapping[str, str]) -> Any:
    """The OpenTelemetry context a W3C `traceparent` (+ `tracestate`) names."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(carrier)
