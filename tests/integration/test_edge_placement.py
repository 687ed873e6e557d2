"""Placement through real processes: an edge over three sim workers with prefix caches, in
a `cache_aware` pool: a conversation's next turn goes where its prefix is cached (and says
so in `usage`), new conversations spread by load, and the workers' load reaches the edge
as they push it; the edge renders prompts to tokens for token-aware routers in front."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import pytest

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from tests.integration.edge_fixtures import EDGE_ENV, wait_ready
from tests.procs import Proc, start_edge, start_worker
from tests.waits import eventually

ADMIN_KEY = "placement-admin-key"
WORKER_ARGS = ("--engine", "sim", "--sim-ttft", "0.005", "--sim-token-delay", "0.01",
               "--sim-prefill-rate", "200000")  # fmt: skip


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, list[Proc]]]:
    workers = [start_worker(*WORKER_ARGS) for _ in range(3)]
    pools = Path(tmp_path_factory.mktemp("pools")) / "pools.json"
    addresses = [w.address for w in workers]
    pools.write_text(json.dumps([{"name": "p", "workers": addresses, "policy": "cache_aware"}]))
    edge = None
    try:
        env = {**EDGE_ENV, "SLUICE_ADMIN_KEY": ADMIN_KEY}
        edge = start_edge("--pools", str(pools), "--load-interval", "0.02", env=env)
        wait_ready(f"http://{edge.address}")
        yield edge, workers
    finally:
        if edge is not None:
            edge.kill()
        for w in workers:
            w.kill()


def chat(edge: Proc, messages: list[dict[str, str]]) -> tuple[str, str, dict[str, object]]:
    """(worker key, answer, usage) of one chat completion."""
    resp = httpx.post(
        f"http://{edge.address}/v1/chat/completions",
        json={"messages": messages, "max_tokens": 8, "temperature": 0},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    return resp.headers["x-sluice-worker"], body["choices"][0]["message"]["content"], body["usage"]


def conversation(i: int) -> list[dict[str, str]]:
    system = f"Assistant {i}. " + " ".join(f"rule{i}x{j}" for j in range(200))
    return [{"role": "system", "content": system}, {"role": "user", "content": f"Hello {i}"}]


def test_a_next_turn_lands_where_its_prefix_is_cached(edge: tuple[Proc, list[Proc]]) -> None:
    proc, _ = edge
    histories = [conversation(i) for i in range(12)]
    with ThreadPoolExecutor(6) as pool:  # six at a time: load spreads the first turns
        firsts = list(pool.map(lambda h: chat(proc, h), histories))
    assert len({w for w, _, _ in firsts}) == 3
    for history, (_, answer, usage) in zip(histories, firsts, strict=True):
        assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
        history += [{"role": "assistant", "content": answer}, {"role": "user", "content": "More?"}]
    # One at a time: the cached prefix decides, not how the six in flight happened to pile
    # up on one worker (a worker holding half the conversations with all of its six in
    # flight loses them to load, by design: on a slow machine that made this test flaky).
    seconds = [chat(proc, h) for h in histories]
    for (first, _, _), (second, _, usage) in zip(firsts, seconds, strict=True):
        assert second == first
        cached = usage["prompt_tokens_details"]["cached_tokens"]  # type: ignore[index]
        assert 200 <= cached < usage["prompt_tokens"]  # type: ignore[operator]


def test_the_edge_sees_the_workers_pushed_load(edge: tuple[Proc, list[Proc]]) -> None:
    proc, workers = edge
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    base = f"http://{proc.address}"

    def reporting() -> dict | None:
        pool = httpx.get(f"{base}/admin/pools", headers=admin, timeout=5).json()["pools"][0]
        reported = [w["reported"] for w in pool["workers"]]
        return pool if all(r and r["kv_cache_tokens"] > 0 for r in reported) else None

    pool = eventually(reporting, what="every worker pushed its load", timeout=5)
    reported = [w["reported"] for w in pool["workers"]]
    assert pool["policy"] == "cache_aware"
    assert all(r and r["kv_cache_tokens"] > 0 and r["max_running"] > 0 for r in reported)
    metrics = httpx.get(f"{base}/metrics", headers=admin, timeout=5).text
    assert "sluice_edge_worker_load{" in metrics
    assert 'sluice_edge_pool_cache_aware_decisions_total{pool="p",reason="cache"}' in metrics
    assert len(workers) == len(reported)


def test_render_gives_the_tokens_a_generation_would_prefill(edge: tuple[Proc, list[Proc]]) -> None:
    proc, workers = edge
    base = f"http://{proc.address}"
    messages = conversation(99)
    resp = httpx.post(f"{base}/v1/chat/completions/render", json={"messages": messages}, timeout=10)
    assert resp.status_code == 200, resp.text
    rendered = resp.json()
    with grpc.insecure_channel(workers[0].address) as ch:
        tokenize = pb.TokenizeRequest()
        tokenize.chat.messages.extend(pb.ChatMessage(role=m["role"], content=m["content"])
                                      for m in messages)  # fmt: skip
        expected = list(pb_grpc.GenerationStub(ch).Tokenize(tokenize, timeout=5).token_ids)
    assert rendered["token_ids"] == expected and rendered["request_id"]
    _, _, usage = chat(proc, messages)
    assert usage["prompt_tokens"] == len(expected)
    resp = httpx.post(f"{base}/v1/completions/render", json={"prompt": "Hello there"}, timeout=10)
    assert resp.status_code == 200 and len(resp.json()) == 1
    assert len(resp.json()[0]["token_ids"]) == 2
    bad = httpx.post(f"{base}/v1/chat/completions/render", json={"messages": []}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
