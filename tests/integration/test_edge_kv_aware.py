"""kv_aware through real processes: sim workers publish their prefix caches' events
(`WatchCache`), an edge in a `kv_aware` pool follows them, and a conversation's next turn
lands where its blocks are, through this edge or another replica (both read the same
events: no shared store needed); a killed worker is dropped from the edge's picture at
once, and comes back empty under a new instance."""

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
from sluice_common import blocks
from tests.integration.edge_fixtures import EDGE_ENV, wait_ready
from tests.procs import Proc, start_edge, start_worker
from tests.waits import eventually

ADMIN_KEY = "kv-aware-admin-key"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
WORKER_ARGS = ("--engine", "sim", "--sim-ttft", "0.005", "--sim-token-delay", "0.005",
               "--sim-prefill-rate", "200000")  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, list[Proc]]]:
    workers = [start_worker(*WORKER_ARGS) for _ in range(3)]
    pools = Path(tmp_path_factory.mktemp("pools")) / "pools.json"
    addresses = [w.address for w in workers]
    pools.write_text(json.dumps([{"name": "p", "workers": addresses, "policy": "kv_aware"}]))
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


def pool(edge: Proc) -> dict:
    doc = httpx.get(f"http://{edge.address}/admin/pools", headers=ADMIN, timeout=5).json()
    return doc["pools"][0]


def views(edge: Proc) -> dict[str, dict]:
    """The edge's picture of each worker's cache, by worker key."""
    return {w["id"]: w["kv_cache"] for w in pool(edge)["workers"]}


def conversation(i: int) -> list[dict[str, str]]:
    system = f"Assistant {i}. " + " ".join(f"rule{i}x{j}" for j in range(200))
    return [{"role": "system", "content": system}, {"role": "user", "content": f"Hello {i}"}]


def test_the_workers_events_reach_the_edge_as_the_cache_holds_them(
    fleet: tuple[Proc, list[Proc]],
) -> None:
    edge, workers = fleet
    messages = conversation(100)
    key, _, _ = chat(edge, messages)
    with grpc.insecure_channel(workers[0].address) as ch:
        stub = pb_grpc.GenerationStub(ch)
        tokenize = pb.TokenizeRequest()
        tokenize.chat.messages.extend(pb.ChatMessage(**m) for m in messages)
        ids = list(stub.Tokenize(tokenize, timeout=5).token_ids)
        by_key = {}
        for w in workers:
            with grpc.insecure_channel(w.address) as wch:
                events = pb_grpc.GenerationStub(wch).WatchCache(pb.WatchCacheRequest(), timeout=5)
                first = next(events)
                events.cancel()
            by_key[w.address] = first
    snapshots = list(by_key.values())
    lay = snapshots[0].layout
    assert all(s.snapshot and s.seq == 0 for s in snapshots)
    assert (lay.block_size, lay.hash_algo, lay.hash_seed) == (
        16, "sha256", blocks.seed_hash(blocks.DEFAULT_SEED))  # fmt: skip
    want = set(blocks.hashes(ids, lay.block_size, lay.hash_seed))
    holders = [a for a, s in by_key.items() if want <= set(s.stored)]
    assert len(want) > 10 and len(holders) == 1  # every full block, on the one that served it
    view = eventually(
        lambda: (v := views(edge)[key])["blocks"] >= len(want) and v,
        what="the edge holds the worker's blocks",
        timeout=5,
    )
    assert view["live"] and view["block_size"] == 16 and view["bytes"] > 0


def test_a_next_turn_lands_where_its_blocks_are(fleet: tuple[Proc, list[Proc]]) -> None:
    edge, _ = fleet
    histories = [conversation(i) for i in range(12)]
    before = dict(pool(edge).get("decisions") or {})
    with ThreadPoolExecutor(6) as ex:  # six at a time: load spreads the first turns
        firsts = list(ex.map(lambda h: chat(edge, h), histories))
    assert len({w for w, _, _ in firsts}) == 3
    for history, (_, answer, usage) in zip(histories, firsts, strict=True):
        assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
        history += [{"role": "assistant", "content": answer}, {"role": "user", "content": "More?"}]
    with ThreadPoolExecutor(6) as ex:
        seconds = list(ex.map(lambda h: chat(edge, h), histories))
    for (first, _, _), (second, _, usage) in zip(firsts, seconds, strict=True):
        assert second == first
        cached = usage["prompt_tokens_details"]["cached_tokens"]  # type: ignore[index]
        assert 200 <= cached < usage["prompt_tokens"]  # type: ignore[operator]
    after = pool(edge)["decisions"]
    assert after.get("kv_cache", 0) - before.get("kv_cache", 0) >= 12
    assert not {k for k in after if not k.startswith("kv_")}  # never fell back
    metrics = httpx.get(f"http://{edge.address}/metrics", headers=ADMIN, timeout=5).text
    assert "sluice_edge_worker_kv_blocks{" in metrics


def test_another_replica_places_the_next_turn_where_the_first_one_did(
    fleet: tuple[Proc, list[Proc]], tmp_path: Path
) -> None:
    edge, workers = fleet
    addresses = ",".join(w.address for w in workers)
    pools = tmp_path / "pools.json"
    pools.write_text(json.dumps([{"name": "p", "workers": addresses.split(","),
                                  "policy": "kv_aware"}]))  # fmt: skip
    other = start_edge("--pools", str(pools), env={**EDGE_ENV, "SLUICE_ADMIN_KEY": ADMIN_KEY})
    try:
        wait_ready(f"http://{other.address}")
        eventually(lambda: all(v["live"] for v in views(other).values()), what="events", timeout=5)
        histories = [conversation(200 + i) for i in range(6)]
        with ThreadPoolExecutor(6) as ex:
            firsts = list(ex.map(lambda h: chat(edge, h), histories))
        assert len({w for w, _, _ in firsts}) > 1
        for history, (_, answer, _) in zip(histories, firsts, strict=True):
            history += [{"role": "assistant", "content": answer}, {"role": "user", "content": "?"}]
        with ThreadPoolExecutor(6) as ex:
            seconds = list(ex.map(lambda h: chat(other, h), histories))
        assert [w for w, _, _ in seconds] == [w for w, _, _ in firsts]
        assert all(u["prompt_tokens_details"]["cached_tokens"] >= 200 for _, _, u in seconds)  # type: ignore[index]
    finally:
        other.kill()


def test_a_killed_worker_is_dropped_at_once_and_comes_back_empty(tmp_path: Path) -> None:
    worker = start_worker(*WORKER_ARGS)
    edge = None
    try:
        env = {**EDGE_ENV, "SLUICE_ADMIN_KEY": ADMIN_KEY}
        edge = start_edge("--worker", worker.address, "--routing-policy", "kv_aware", env=env)
        wait_ready(f"http://{edge.address}")
        key, _, _ = chat(edge, conversation(7))
        held = eventually(lambda: views(edge)[key]["blocks"], what="blocks held", timeout=5)
        instance = views(edge)[key]["instance"]
        assert held > 10
        worker.kill()
        eventually(lambda: views(edge)[key] == {**views(edge)[key], "live": False, "blocks": 0},
                   what="the killed worker's blocks dropped", timeout=2)  # fmt: skip
        worker = start_worker(*WORKER_ARGS, "--port", str(worker.port))
        back = eventually(lambda: (v := views(edge)[key])["live"] and v, what="back", timeout=10)
        assert back["blocks"] == 0 and back["instance"] != instance
        chat(edge, conversation(7))
        assert eventually(lambda: views(edge)[key]["blocks"], what="held again", timeout=5) == held
    finally:
        if edge is not None:
            edge.kill()
        worker.kill()
