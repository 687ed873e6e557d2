"""The edge as a process: graceful shutdown with streams in flight, several processes."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import httpx

from tests.integration.edge_fixtures import chat_text, chunks, parse_sse, stream_raw, wait_ready
from tests.procs import start_edge, worker

BODY = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 60, "min_tokens": 60}


def test_sigterm_lets_the_in_flight_stream_finish_then_exits_0() -> None:
    with worker("--engine", "sim", "--sim-token-delay", "0.01") as w:
        edge = start_edge("--worker", w.address, "--drain-grace", "10")
        try:
            base = f"http://{edge.address}"
            wait_ready(base)
            result: dict[str, Any] = {}

            def run() -> None:
                result["resp"], result["raw"] = stream_raw(
                    base, "/v1/chat/completions", {**BODY, "stream": True}
                )

            reader = threading.Thread(target=run)
            reader.start()
            time.sleep(0.2)  # the stream is under way (60 tokens take ~0.6 s)
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
