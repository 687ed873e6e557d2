"""Observability: Prometheus metrics, OpenTelemetry tracing, logs."""
