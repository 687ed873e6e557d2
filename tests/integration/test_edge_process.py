"""The edge as a process: graceful shutdown with streams in flight, several processes."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.integration.edge_fixtures import chat_text, chunks, parse_sse, wait_ready
from tests.procs import start_edge, worker
from tests.waits import eventually

BODY = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 60, "min_tokens": 60}


def test_sigterm_lets_the_in_flight_stream_finish_then_exits_0() -> None:
    with worker("--engine", "sim", "--sim-token-delay", "0.01") as w:
        edge = start_edge("--worker", w.address, "--drain-grace", "10")
        try:
            base = f"http://{edge.address}"
            wait_ready(base)
            result: dict[str, Any] = {}
            under_way = threading.Event()

            def run() -> None:
                url, body = f"{base}/v1/chat/completions", {**BODY, "stream": True}
                with httpx.stream("POST", url, json=body, timeout=60) as r:
                    raw = b""
                    for part in r.iter_bytes():
                        raw += part
                        if raw.count(b"\ndata: {") >= 2:  # the role chunk and a token
                            under_way.set()
                result["raw"] = raw

            reader = threading.Thread(target=run)
            reader.start()
            assert under_way.wait(15), "the stream never got under way"
            edge.proc.send_signal(signal.SIGTERM)
            reader.join(15)
            assert edge.proc.wait(15) == 0
        finally:
            edge.kill()
        got = chunks(parse_sse(result["raw"]))  # ends with [DONE]: it was not cut
        assert got[-1]["choices"][0]["finish_reason"] == "length"
        assert len(chat_text(got).split(" ")) == 60 + 1


def test_several_edge_processes_share_the_port() -> None:
    with worker("--engine", "sim") as w:
        edge = start_edge("--worker", w.address, "--processes", "2")
        try:
            base = f"http://{edge.address}"
            wait_ready(base)
            for _ in range(4):  # new connections: whichever process accepts must serve
                resp = httpx.post(f"{base}/v1/completions", json={"prompt": "x", "max_tokens": 3})
                assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 3
        finally:
            assert edge.terminate() == 0


class SlowHealth(health_pb2_grpc.HealthServicer):
    """A health service whose Watch answers SERVING only after `delay_s` (a worker slow to
    answer on a busy machine), then holds the stream open. A stand-in for the worker's
    health service alone: a real worker answers within milliseconds, too soon to show
    what the edge does before the first answer."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.watches = 0

    def Watch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.watches += 1
        time.sleep(self.delay_s)
        yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
        done = threading.Event()
        context.add_callback(done.set)
        done.wait()


def test_no_process_of_a_several_process_edge_answers_before_it_heard_from_its_worker() -> None:
    """Regression (a CI run: /v1/models 503 beside 200s): with `--processes 2`, /readyz
    answered by one process said nothing of the other, which accepted requests before its
    worker's health watch had answered, and said no worker was SERVING. The edge writes its
    port file before its processes accept: the first answer of each must already know."""
    health = SlowHealth(delay_s=0.5)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        edge = start_edge("--worker", f"127.0.0.1:{port}", "--processes", "2")
        try:
            base = f"http://{edge.address}"
            # New connections, so that the kernel hands them to both processes.
            answers = [httpx.get(f"{base}/readyz", timeout=10) for _ in range(8)]
            assert [(r.status_code, r.json()["ready"]) for r in answers] == [(200, True)] * 8
            # Each process watches the worker (one may have answered all 8 while the other
            # was still starting).
            eventually(lambda: health.watches >= 2, what="both processes watch the worker")
        finally:
            edge.kill()
    finally:
        server.stop(grace=None)


def test_a_killed_several_process_edge_leaves_no_process_behind() -> None:
    """Regression: a `--processes 2` edge killed by SIGKILL left its two spawned processes
    (and multiprocessing's resource tracker) running for the rest of the machine's life."""
    with worker("--engine", "sim") as w:
        edge = start_edge("--worker", w.address, "--processes", "2")
        wait_ready(f"http://{edge.address}")
        group = edge.proc.pid  # `start_edge` makes the edge lead a process group

        def members() -> list[int]:
            found = []
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        if os.getpgid(int(entry)) == group:
                            found.append(int(entry))
                    except ProcessLookupError:
                        pass
            return found

        assert len(members()) >= 3  # the parent and its two processes at least
        edge.kill()
        assert eventually(lambda: members() == [], what="no process of the edge's group")


@pytest.mark.chaos
def test_drain_past_its_grace_ends_streams_with_a_retryable_error_and_readyz_503() -> None:
    """Issue 12, defect 8: a stream longer than the drain grace got a cut connection, and
    /readyz stayed 200 until the edge stopped listening."""
    with worker("--engine", "sim", "--sim-token-delay", "0.05") as w:
        edge = start_edge("--worker", w.address, "--drain-grace", "1")
        try:
            base = f"http://{edge.address}"
            wait_ready(base)
            events: list[dict[str, str]] = []
            whole: dict[str, httpx.Response] = {}
            long_whole = {**BODY, "max_tokens": 200, "min_tokens": 200}
            waiting = threading.Thread(
                target=lambda: whole.update(
                    r=httpx.post(f"{base}/v1/chat/completions", json=long_whole, timeout=15)
                )
            )
            waiting.start()  # not streamed: nothing is sent until its end
            with httpx.Client(timeout=15) as c:
                long = {**BODY, "max_tokens": 200, "min_tokens": 200, "stream": True}
                with c.stream("POST", f"{base}/v1/chat/completions", json=long) as resp:
                    raw = b""
                    parts = resp.iter_bytes()
                    while raw.count(b"\ndata: {") < 4:  # the stream is under way
                        raw += next(parts)
                    edge.proc.send_signal(signal.SIGTERM)
                    ready = httpx.get(f"{base}/readyz", timeout=5)
                    refused = httpx.post(f"{base}/v1/completions", json={"prompt": "x"}, timeout=5)
                    raw += b"".join(parts)  # to the end: the response must close cleanly
            waiting.join(15)
            assert ready.status_code == 503 and ready.json()["draining"] is True
            # Review finding: one with nothing sent yet got uvicorn's plain 500.
            assert whole["r"].status_code == 503
            assert whole["r"].json()["error"]["code"] == "unavailable"
            assert refused.status_code == 503 and "retry-after" in refused.headers
            assert edge.proc.wait(15) == 0
        finally:
            edge.kill()
        events = [e for e in parse_sse(raw) if "data" in e]
        last = events[-1]
        assert last.get("event") == "error" and "id" not in last
        err = json.loads(last["data"])["error"]
        assert err["code"] == "unavailable" and err["retryable"] is True
        assert err["last_event_id"] == [e for e in events if "id" in e][-1]["id"]
        assert all(e["data"] != "[DONE]" for e in events)
