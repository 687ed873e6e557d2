"""LoRA adapters through a real edge and two real sim workers: listing with `parent`,
routing to the worker holding an adapter, adapter affinity, `--lora-autoload`, admin
load/unload, and the errors (unknown adapter, slots full, bad names and paths)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from tests.integration.edge_fixtures import EDGE_ENV, chat_start, direct_generate, wait_ready
from tests.lora import write_sim_adapter
from tests.procs import Proc, start_edge, start_worker
from tests.waits import eventually

ADMIN_KEY = "adapters-test-admin-key-0123456789"
AUTH = {"authorization": f"Bearer {ADMIN_KEY}"}
BASE = "sim-base"
HELLO = [{"role": "user", "content": "hello there"}]


@dataclass
class Fleet:
    one: Proc  # --lora a, two slots
    two: Proc  # one slot
    edge: Proc
    dirs: dict[str, Path]

    @property
    def base(self) -> str:
        return f"http://{self.edge.address}"

    def chat(self, model: str, **extra: Any) -> httpx.Response:
        body = {"model": model, "messages": HELLO, "temperature": 0, "max_tokens": 8, **extra}
        return httpx.post(f"{self.base}/v1/chat/completions", json=body, timeout=10)

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, f"{self.base}/admin{path}", headers=AUTH, timeout=10, **kwargs)

    def key(self, worker: Proc) -> str:
        listing = self.admin("GET", "/pools").json()["pools"][0]["workers"]
        return next(w["id"] for w in listing if w["address"] == worker.address)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("adapters")
    dirs = {n: write_sim_adapter(root / n) for n in ("a", "b", "c", "x", "y", "wide")}
    dirs["wide"] = write_sim_adapter(root / "wide", rank=64)
    sim = ("--engine", "sim", "--served-model-name", BASE, "--sim-token-delay", "0.002")
    one = start_worker(*sim, "--lora", f"a={dirs['a']}", "--max-loras", "2")
    two = start_worker(*sim, "--max-loras", "1")
    edge = None
    try:
        edge = start_edge(
            *("--worker", one.address, "--worker", two.address, "--lora-autoload"),
            *("--lora", f"b={dirs['b']}", "--lora", f"c={dirs['c']}"),
            env={**EDGE_ENV, "SLUICE_ADMIN_KEY": ADMIN_KEY},
        )
        wait_ready(f"http://{edge.address}")
        yield Fleet(one, two, edge, dirs)
    finally:
        for p in (edge, one, two):
            if p is not None:
                p.kill()


def _worker_text(address: str, model: str) -> str:
    start = chat_start(HELLO, temperature=0, max_tokens=8)
    start.model = model
    return direct_generate(address, start)[0]


def test_an_adapter_is_listed_with_its_base_and_answers_as_its_worker_does(fleet: Fleet) -> None:
    models = httpx.get(f"{fleet.base}/v1/models", timeout=5).json()["data"]
    listed = {m["id"]: (m["parent"], m["root"]) for m in models}
    assert listed == {BASE: (None, BASE), "a": (BASE, str(fleet.dirs["a"]))}
    base, adapted = fleet.chat(BASE), fleet.chat("a")
    assert (base.status_code, adapted.status_code) == (200, 200)
    # Only worker one holds `a`: every request for it lands there, answered as it answers.
    assert adapted.headers["x-sluice-worker"] == fleet.key(fleet.one)
    text = adapted.json()["choices"][0]["message"]["content"]
    assert text == _worker_text(fleet.one.address, "a")
    assert text != base.json()["choices"][0]["message"]["content"]
    assert adapted.json()["model"] == "a"


def test_an_unknown_adapter_is_404_model_not_found(fleet: Fleet) -> None:
    resp = fleet.chat("nobody")
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "model_not_found"
    assert fleet.chat(BASE).status_code == 200


def test_bad_names_and_paths_are_clear_errors_and_the_workers_serve_on(
    fleet: Fleet, tmp_path: Path
) -> None:
    cases = [
        ({"name": "no spaces", "path": str(fleet.dirs["x"])}, 400, "name"),
        ({"name": "ok", "path": str(tmp_path / "missing")}, 400, "path"),
        ({"name": "ok", "path": "relative/dir"}, 400, "path"),
        ({"name": "ok", "path": str(fleet.dirs["wide"])}, 400, "path"),  # rank 64 > 16
        ({"name": BASE, "path": str(fleet.dirs["x"])}, 409, "name"),
    ]
    got = []
    for body, _, _ in cases:
        resp = fleet.admin("POST", "/adapters", json={**body, "workers": [fleet.one.address]})
        error = resp.json()["error"]
        got.append((resp.status_code, error["param"]))
        print(error["message"])
    assert got == [(status, param) for _, status, param in cases]
    missing = fleet.admin("POST", "/adapters", json={"name": "ok"})
    assert (missing.status_code, missing.json()["error"]["param"]) == (400, "path")
    assert fleet.chat("a").status_code == 200
    assert fleet.chat(BASE).status_code == 200


def test_adapters_load_unload_autoload_and_run_out_of_slots(fleet: Fleet) -> None:
    # Worker two's one slot: taken through the admin API, on that worker only.
    loaded = fleet.admin(
        "POST",
        "/adapters",
        json={"name": "x", "path": str(fleet.dirs["x"]), "workers": [fleet.two.address]},
    )
    assert loaded.status_code == 201, loaded.text
    assert loaded.json()["loaded"] == [fleet.key(fleet.two)]
    full = fleet.admin(
        "POST",
        "/adapters",
        json={"name": "y", "path": str(fleet.dirs["y"]), "workers": [fleet.two.address]},
    )
    assert (full.status_code, full.json()["error"]["code"]) == (409, "adapter_slots_full")
    # `b` is known to the edge and held nowhere: autoload puts it where a slot is free.
    first = fleet.chat("b")
    assert first.status_code == 200, first.text
    assert first.headers["x-sluice-worker"] == fleet.key(fleet.one)
    assert first.json()["choices"][0]["message"]["content"] == _worker_text(fleet.one.address, "b")
    # Every slot is taken now: `c` cannot be placed.
    refused = fleet.chat("c")
    assert (refused.status_code, refused.json()["error"]["code"]) == (503, "adapter_slots_full")
    # Unloading frees its slot and it is gone at once; a second unload finds nothing.
    assert fleet.admin("DELETE", "/adapters/x").status_code == 200
    gone = fleet.chat("x")
    assert (gone.status_code, gone.json()["error"]["code"]) == (404, "model_not_found")
    again = fleet.admin("DELETE", "/adapters/x")
    assert (again.status_code, again.json()["error"]["code"]) == (404, "adapter_not_found")
    placed = fleet.chat("c")
    assert placed.status_code == 200 and placed.headers["x-sluice-worker"] == fleet.key(fleet.two)
    for name in ("b", "c"):
        assert fleet.admin("DELETE", f"/adapters/{name}").status_code == 200


def test_an_adapter_loaded_past_the_edge_is_routed_once_the_worker_says_so(fleet: Fleet) -> None:
    """Another edge (here: a direct call) loads an adapter: this edge learns it from the
    worker's load push (`models_version`) and routes to it."""
    with grpc.insecure_channel(fleet.two.address) as channel:
        stub = pb_grpc.GenerationStub(channel)
        stub.LoadAdapter(pb.LoadAdapterRequest(name="y", path=str(fleet.dirs["y"])), timeout=5)
        eventually(lambda: fleet.chat("y").status_code == 200, what="the edge routes y")
        stub.UnloadAdapter(pb.UnloadAdapterRequest(name="y"), timeout=5)
        eventually(lambda: fleet.chat("y").status_code == 404, what="the edge forgets y")


def test_a_request_goes_where_its_adapter_is_at_work(fleet: Fleet) -> None:
    """Adapter affinity: with `a` on both workers and at work on one, new requests for it go
    to that one, though the other is less loaded (the plain policy would pick it)."""
    loaded = fleet.admin(
        "POST",
        "/adapters",
        json={"name": "a", "path": str(fleet.dirs["a"]), "workers": [fleet.two.address]},
    )
    assert loaded.status_code == 201, loaded.text
    body = {"model": "a", "messages": HELLO, "max_tokens": 2000, "stream": True, "ignore_eos": True}
    try:
        with httpx.stream(
            "POST", f"{fleet.base}/v1/chat/completions", json=body, timeout=30
        ) as long:
            busy = long.headers["x-sluice-worker"]

            def warm_on() -> list[str]:
                (entry,) = [
                    e
                    for e in fleet.admin("GET", "/adapters").json()["adapters"]
                    if e["name"] == "a"
                ]
                return [w["id"] for w in entry["workers"] if w["warm"]]

            eventually(lambda: warm_on() == [busy], what="the edge sees a at work")
            landed = {fleet.chat("a").headers["x-sluice-worker"] for _ in range(6)}
            assert landed == {busy}
    finally:
        assert fleet.admin("DELETE", f"/adapters/a?worker={fleet.two.address}").status_code == 200
