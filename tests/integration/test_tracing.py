"""OpenTelemetry tracing end to end: a real OTLP/gRPC trace receiver (the collector's
TraceService, served by this test on 127.0.0.1) gets the spans of a real edge and two real
sim workers, exported by the OpenTelemetry SDK.

One trace per request, continuing the client's `traceparent`: the edge's request, route
and attempt spans, and under each attempt the worker's generation with its queue,
prefill and decode. A worker killed mid-stream shows as two attempts of one request.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import orjson
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as otlp_grpc

from tests.integration.edge_fixtures import EDGE_ENV, parse_sse, wait_ready, worker_stats
from tests.procs import Proc, start_edge, start_worker
from tests.waits import eventually

pytestmark = pytest.mark.slow

# Export each batch within 100 ms, so the test waits on spans, not on the SDK's 5 s timer.
TRACE_ENV = {"OTEL_BSP_SCHEDULE_DELAY": "100"}
MESSAGES = [{"role": "user", "content": "Trace this answer, please."}]


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    error: bool
    start_ns: int
    end_ns: int


class Receiver(otlp_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver that keeps what it is sent."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.lock = threading.Lock()

    def Export(self, request: otlp.ExportTraceServiceRequest, context: Any) -> Any:
        got = []
        for rs in request.resource_spans:
            attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(
                        Span(
                            service=attrs.get("service.name", ""),
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            error=s.status.code == s.status.STATUS_CODE_ERROR,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                        )
                    )
        with self.lock:
            self.spans.extend(got)
        return otlp.ExportTraceServiceResponse()

    def trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait(self, trace_id: str, done: Any, timeout: float = 15.0) -> list[Span]:
        """The trace's spans once `done(spans)` holds."""

        def complete() -> list[Span]:
            spans = self.trace(trace_id)
            return spans if done(spans) else []

        return eventually(
            complete,
            what=f"trace {trace_id} complete",
            timeout=timeout,
            detail=lambda: [(s.service, s.name) for s in self.trace(trace_id)],
        )


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass
class Traced:
    receiver: Receiver
    workers: list[Proc]
    edge: Proc

    @property
    def base(self) -> str:
        return f"http://{self.edge.address}"


@pytest.fixture(scope="module")
def traced() -> Iterator[Traced]:
    receiver = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    otlp_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    workers: list[Proc] = []
    edge: Proc | None = None
    try:
        for _ in range(2):
            workers.append(
                start_worker(
                    "--engine",
                    "sim",
                    "--sim-token-delay",
                    "0.02",
                    "--otlp-endpoint",
                    endpoint,
                    env=TRACE_ENV,
                )
            )
        worker_flags = [a for w in workers for a in ("--worker", w.address)]
        edge = start_edge(*worker_flags, env={**EDGE_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                                              **TRACE_ENV})  # fmt: skip
        wait_ready(f"http://{edge.address}")
        yield Traced(receiver, workers, edge)
    finally:
        if edge is not None:
            edge.kill()
        for w in workers:
            w.kill()
        server.stop(0)


def traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def shape(spans: list[Span]) -> list[tuple[str, str, str]]:
    """(service, span, parent span's name) for each span, sorted: the trace's tree."""
    by_id = {s.span_id: s for s in spans}
    return sorted(
        (s.service, s.name, by_id[s.parent_id].name if s.parent_id in by_id else "-") for s in spans
    )


def test_one_trace_per_request_from_the_client_to_the_worker_phases(traced: Traced) -> None:
    header, trace_id, client_span = traceparent()
    body = {"messages": MESSAGES, "max_tokens": 5}
    resp = httpx.post(
        f"{traced.base}/v1/chat/completions",
        json=body,
        headers={"traceparent": header},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    spans = traced.receiver.wait(trace_id, lambda ss: {"request", "decode"} <= {s.name for s in ss})
    assert shape(spans) == [
        ("sluice-edge", "attempt", "request"),
        ("sluice-edge", "request", "-"),
        ("sluice-edge", "route", "request"),
        ("sluice-worker", "decode", "generation"),
        ("sluice-worker", "generation", "attempt"),
        ("sluice-worker", "prefill", "generation"),
        ("sluice-worker", "queue", "generation"),
    ]
    (request,) = [s for s in spans if s.name == "request"]
    assert request.parent_id == client_span  # the client's span is the root's parent
    assert request.attributes["http.response.status_code"] == 200
    (attempt,) = [s for s in spans if s.name == "attempt"]
    assert attempt.attributes["sluice.outcome"] == "ok" and attempt.attributes["sluice.tokens"] == 5
    (gen,) = [s for s in spans if s.name == "generation"]
    assert gen.attributes["gen_ai.usage.output_tokens"] == 5
    assert gen.attributes["sluice.code"] == "OK"
    # The worker's phases follow one another inside the generation, inside the attempt.
    phases = {s.name: s for s in spans if s.parent_id == gen.span_id}
    assert gen.start_ns <= phases["queue"].start_ns <= phases["prefill"].start_ns
    assert phases["prefill"].end_ns <= phases["decode"].end_ns <= gen.end_ns
    assert attempt.start_ns <= gen.start_ns and gen.end_ns <= attempt.end_ns + 50_000_000


def test_a_request_without_traceparent_starts_its_own_trace(traced: Traced) -> None:
    before = {s.trace_id for s in traced.receiver.spans}
    assert httpx.get(f"{traced.base}/readyz", timeout=10).status_code == 200  # not traced
    resp = httpx.post(
        f"{traced.base}/v1/chat/completions",
        json={"messages": MESSAGES, "max_tokens": 2},
        timeout=30,
    )
    assert resp.status_code == 200

    def new_trace() -> tuple[set[str], list[Span]] | None:
        with traced.receiver.lock:
            new = {s.trace_id for s in traced.receiver.spans} - before
            roots = [s for s in traced.receiver.spans if s.trace_id in new and s.name == "request"]
        if not roots or all(s.name != "decode" for s in traced.receiver.trace(roots[0].trace_id)):
            return None
        return new, roots

    new, roots = eventually(new_trace, what="a new trace with its decode span", timeout=15)
    assert len(new) == 1
    (root,) = roots
    assert root.parent_id == ""


def test_a_worker_killed_mid_stream_shows_as_two_attempts(traced: Traced) -> None:
    header, trace_id, _ = traceparent()
    body = {"messages": MESSAGES, "max_tokens": 60, "min_tokens": 60, "temperature": 0.8,
            "stream": True}  # fmt: skip
    raw = b""
    killed: Proc | None = None
    with httpx.stream(
        "POST",
        f"{traced.base}/v1/chat/completions",
        json=body,
        headers={"traceparent": header},
        timeout=30,
    ) as resp:
        assert resp.status_code == 200
        for part in resp.iter_bytes():
            raw += part
            if killed is None and raw.count(b'"content"') >= 5:
                killed = next(w for w in traced.workers if worker_stats(w.address).running > 0)
                killed.kill()
    events = [e for e in parse_sse(raw) if "data" in e]
    assert events[-1]["data"] == "[DONE]", events[-3:]
    text = "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in (orjson.loads(e["data"]) for e in events[:-1])
        if c["choices"]
    )
    assert len(text.split()) == 60
    spans = traced.receiver.wait(
        trace_id,
        lambda ss: (
            sum(s.name == "attempt" for s in ss) == 2
            and any(s.name == "request" for s in ss)
            and any(s.name == "decode" for s in ss)
        ),
    )
    (request,) = [s for s in spans if s.name == "request"]
    attempts = sorted((s for s in spans if s.name == "attempt"), key=lambda s: s.start_ns)
    assert [a.parent_id for a in attempts] == [request.span_id] * 2
    first, second = attempts
    assert first.attributes["sluice.worker"] == killed.address  # type: ignore[union-attr]
    assert first.error and first.attributes["sluice.outcome"] != "ok"
    assert first.attributes["sluice.tokens"] >= 4  # (the 5 "content" counted the role's too)
    assert second.attributes["sluice.continuation"] == 1
    assert second.attributes["sluice.outcome"] == "ok" and not second.error
    assert first.attributes["sluice.tokens"] + second.attributes["sluice.tokens"] == 60
    routes = [s for s in spans if s.name == "route"]
    assert len(routes) == 2 and {r.parent_id for r in routes} == {request.span_id}
    # The surviving worker's generation hangs under the second attempt (the killed
    # worker's spans died with it).
    gens = [s for s in spans if s.name == "generation"]
    assert [g.parent_id for g in gens] == [second.span_id]
