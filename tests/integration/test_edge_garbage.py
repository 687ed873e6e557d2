"""The edge's requests leave no reference cycles behind: each one's objects go with
their last reference, not in a collection. With 20,000 streams open, collecting what
ended streams left held the edge's loop ~0.7 s (BENCHMARKS.md, issue 22 round 7)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import orjson

from tests.integration.edge_fixtures import wait_ready
from tests.procs import _spawn, worker
from tests.waits import eventually


def chat(**extra: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, **extra}


def test_requests_and_refusals_leave_no_cycles_for_the_collector(tmp_path: Path) -> None:
    found = tmp_path / "garbage.json"
    with worker("--engine", "sim") as w:
        edge = _spawn(
            "tests.gc_edge", ["--worker", w.address], 30.0, {"SLUICE_GARBAGE_FILE": str(found)}
        )
        try:
            base = f"http://{edge.address}"
            wait_ready(base)
            asked = [
                (chat(stream=True), 200),
                (chat(), 200),
                (chat(model="nope"), 404),
                (chat(temperature=7), 400),
            ]
            with httpx.Client(base_url=base, timeout=30) as client:
                # A client that leaves mid-stream, first: its stream ends while the rest run.
                long = chat(stream=True, max_tokens=500)
                with client.stream("POST", "/v1/chat/completions", json=long) as r:
                    next(r.iter_bytes())
                got = []
                for path, body in [
                    ("/v1/responses", {"input": "hi", "max_output_tokens": 5}),
                    ("/v1/messages", {**chat(stream=True), "model": "sim-model"}),
                ]:
                    got.append(client.post(path, json=body).status_code)
                for body, _ in asked * 5:
                    got.append(client.post("/v1/chat/completions", json=body).status_code)
                got.append(client.get("/v1/models").status_code)
                got.append(client.get("/v1/nothing").status_code)
                assert got == [200, 200] + [s for _, s in asked] * 5 + [200, 404]
                os.kill(edge.proc.pid, signal.SIGUSR1)
                eventually(found.exists, what="the edge wrote what it collected")
            assert orjson.loads(found.read_bytes()) == {}
        finally:
            edge.kill()
