"""kv_aware on a real engine: the session's vLLM worker (`--kv-events`, prefix caching
on) publishes its KV-cache events, an edge follows them, computes a chat's block hashes
as vLLM names them (tokens from the worker's `Tokenize`), and places the conversation's
second turn on what the events said is held: a `kv_cache` decision, with cached tokens.
vLLM on CPU caches full 128-token blocks, so the system prompt is several blocks long."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.integration.edge_fixtures import EDGE_ENV, wait_ready
from tests.procs import Proc, start_edge
from tests.waits import eventually

pytestmark = pytest.mark.model

ADMIN_KEY = "model-kv-aware-admin-key"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def edge(vllm_worker: Proc) -> Iterator[Proc]:
    env = {**EDGE_ENV, "SLUICE_ADMIN_KEY": ADMIN_KEY}
    proc = start_edge("--worker", vllm_worker.address, "--routing-policy", "kv_aware", env=env)
    try:
        wait_ready(f"http://{proc.address}", timeout=60)
        yield proc
    finally:
        proc.kill()


def pool(edge: Proc) -> dict:
    doc = httpx.get(f"http://{edge.address}/admin/pools", headers=ADMIN, timeout=5).json()
    return doc["pools"][0]


def chat(edge: Proc, messages: list[dict[str, str]]) -> tuple[str, dict]:
    resp = httpx.post(
        f"http://{edge.address}/v1/chat/completions",
        json={"messages": messages, "max_tokens": 4, "temperature": 0},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    return body["choices"][0]["message"]["content"], body["usage"]


def test_vllms_events_reach_the_edge_and_place_the_second_turn(edge: Proc) -> None:
    rules = " ".join(f"Rule {j} of the kv test: answer in one short line." for j in range(50))
    history = [
        {"role": "system", "content": f"You are the kv-aware test assistant. {rules}"},
        {"role": "user", "content": "What is the capital of Spain?"},
    ]
    before = pool(edge)["decisions"].get("kv_cache", 0)
    answer, usage = chat(edge, history)
    full = usage["prompt_tokens"] // 128
    assert full >= 3

    def held() -> dict | None:
        (view,) = [w["kv_cache"] for w in pool(edge)["workers"]]
        return view if view["live"] and view["blocks"] >= full else None

    view = eventually(held, what="vLLM's events of the first turn at the edge", timeout=10)
    assert view["block_size"] == 128 and view["events"] > 0
    history += [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And France?"},
    ]
    _, usage = chat(edge, history)
    assert usage["prompt_tokens_details"]["cached_tokens"] >= full * 128
    assert pool(edge)["decisions"].get("kv_cache", 0) == before + 1
