"""Placement with a real engine beside a simulated one: the session's `vllm_worker`
(prefix caching on, shared with the other model tests) and a prefix-caching sim worker
behind an edge whose pool is `cache_aware`. A conversation's second turn lands on the
worker that served its first, and that worker reports part of its prompt as cached
(`cached_tokens > 0`). The second worker is simulated because a second vLLM start costs
the suite ~35 s; what it shows of vLLM (its cached tokens, its pushed load) comes from the
real one, whichever worker each conversation lands on.

vLLM on CPU caches full 128-token blocks only, so each conversation opens with a system
prompt of several hundred tokens. Three conversations, so that luck (a coin flip per
second turn between two workers) cannot pass the test. Run alone with `pytest -m model`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import MAX_NUM_SEQS, _make_model
from tests.integration.edge_fixtures import EDGE_ENV, wait_ready
from tests.procs import Proc, start_edge, start_worker
from tests.waits import eventually

pytestmark = pytest.mark.model

ADMIN_KEY = "model-placement-admin-key"


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, vllm_worker: Proc
) -> Iterator[tuple[Proc, list[Proc]]]:
    args = ("--engine", "sim", "--model", str(_make_model()), "--max-num-seqs", "4",
            "--sim-prefix-cache")  # fmt: skip
    workers: list[Proc] = []
    edge = None
    try:
        workers = [start_worker(*args)]
        pools = Path(tmp_path_factory.mktemp("pools")) / "pools.json"
        addresses = [vllm_worker.address, workers[0].address]
        pools.write_text(json.dumps([{"name": "p", "workers": addresses, "policy": "cache_aware"}]))
        env = {**EDGE_ENV, "SLUICE_ADMIN_KEY": ADMIN_KEY}
        edge = start_edge("--pools", str(pools), env=env)
        wait_ready(f"http://{edge.address}", timeout=60)
        yield edge, [vllm_worker, *workers]
    finally:
        if edge is not None:
            edge.kill()
        for w in workers:
            w.terminate()


def chat(edge: Proc, messages: list[dict[str, str]]) -> tuple[str, str, int]:
    """(worker key, answer, cached prompt tokens) of one greedy chat completion."""
    resp = httpx.post(
        f"http://{edge.address}/v1/chat/completions",
        json={"messages": messages, "max_tokens": 12, "temperature": 0},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
    return resp.headers["x-sluice-worker"], body["choices"][0]["message"]["content"], cached


def system_prompt(i: int) -> str:
    rules = " ".join(f"Rule {j} of assistant {i}: answer plainly and briefly." for j in range(60))
    return f"You are assistant number {i}. {rules}"


def test_a_second_turn_lands_where_its_prefix_is_cached(fleet: tuple[Proc, list[Proc]]) -> None:
    edge, _ = fleet
    for i in range(3):
        history = [
            {"role": "system", "content": system_prompt(i)},
            {"role": "user", "content": "What is the capital of France?"},
        ]
        first, answer, cached = chat(edge, history)
        assert cached == 0  # a system prompt no worker has seen
        history += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And of Italy?"},
        ]
        second, _, cached = chat(edge, history)
        assert second == first, f"conversation {i}: turn 2 went to another worker"
        assert cached > 0, f"conversation {i}: no prompt token was cached on turn 2"


def test_the_vllm_workers_push_their_load(fleet: tuple[Proc, list[Proc]]) -> None:
    edge, _ = fleet
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}

    def reporting() -> dict | None:
        pool = httpx.get(f"http://{edge.address}/admin/pools", headers=headers).json()["pools"][0]
        reported = [w["reported"] for w in pool["workers"]]
        return pool if all(r and r["kv_cache_tokens"] for r in reported) else None

    pool = eventually(reporting, what="every worker pushed its load", interval=0.1)
    reported = [w["reported"] for w in pool["workers"]]
    assert all(r and r["kv_cache_tokens"] > 0 for r in reported)
    assert sorted(r["max_running"] for r in reported) == sorted([4, MAX_NUM_SEQS])
    assert pool["decisions"]["cache"] >= 3
