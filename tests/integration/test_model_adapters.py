"""LoRA adapters on the real engine: two PEFT adapters with random weights, written here for
SmolLM2, loaded at run time through the edge's admin API into the session's vLLM worker
(vLLM's own LoRA loading path, on CPU), answer differently from the base model and from
each other through the official SDK; bad adapters are refused clearly and the worker
serves on."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.integration.conftest import _make_model
from tests.integration.edge_fixtures import EDGE_ENV, wait_ready
from tests.lora import write_peft_adapter, write_sim_adapter
from tests.procs import Proc, start_edge

pytestmark = pytest.mark.model

ADMIN_KEY = "model-adapters-admin-key-0123456789"
AUTH = {"authorization": f"Bearer {ADMIN_KEY}"}
ASK = [{"role": "user", "content": "Name three colours."}]


@dataclass
class Setup:
    edge: Proc
    client: openai.OpenAI
    dirs: dict[str, Path]

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        url = f"http://{self.edge.address}/admin{path}"
        return httpx.request(method, url, headers=AUTH, timeout=60, **kwargs)

    def answer(self, model: str) -> str:
        messages: Any = ASK
        out = self.client.chat.completions.create(
            model=model, messages=messages, temperature=0, max_tokens=12
        )
        return out.choices[0].message.content or ""


@pytest.fixture(scope="module")
def setup(vllm_worker: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("lora")
    model_dir = _make_model()
    dirs = {
        "adapter-a": write_peft_adapter(root / "a", model_dir, seed=1),
        "adapter-b": write_peft_adapter(root / "b", model_dir, seed=2),
        "no-weights": write_sim_adapter(root / "no-weights"),  # a config, no weights
    }
    edge = start_edge(
        "--worker", vllm_worker.address, env={**EDGE_ENV, "SLUICE_ADMIN_KEY": ADMIN_KEY}
    )
    try:
        wait_ready(f"http://{edge.address}", timeout=30)
        with openai.OpenAI(
            base_url=f"http://{edge.address}/v1", api_key="none", max_retries=0, timeout=120
        ) as client:
            s = Setup(edge, client, dirs)
            yield s
            for name in ("adapter-a", "adapter-b"):  # the shared worker's slots, freed
                s.admin("DELETE", f"/adapters/{name}")
    finally:
        edge.kill()


def test_two_adapters_answer_differently_from_the_base_and_each_other(setup: Setup) -> None:
    for name in ("adapter-a", "adapter-b"):
        resp = setup.admin("POST", "/adapters", json={"name": name, "path": str(setup.dirs[name])})
        assert resp.status_code == 201, resp.text
    listed = {m.id: getattr(m, "parent", None) for m in setup.client.models.list()}
    base = next(name for name, parent in listed.items() if parent is None)
    assert listed == {base: None, "adapter-a": base, "adapter-b": base}
    answers = {m: setup.answer(m) for m in (base, "adapter-a", "adapter-b")}
    assert len(set(answers.values())) == 3, answers
    assert setup.answer("adapter-a") == answers["adapter-a"]  # greedy: the same again


def test_bad_adapters_are_refused_clearly_and_the_worker_serves_on(setup: Setup) -> None:
    before = setup.answer("adapter-a")
    # Unloaded at run time: gone at once (its slot free again), the other answers as before.
    assert setup.admin("DELETE", "/adapters/adapter-b").status_code == 200
    with pytest.raises(openai.NotFoundError):
        setup.answer("adapter-b")
    assert setup.answer("adapter-a") == before
    # A directory our checks accept but vLLM's loader refuses (no weights in it).
    refused = setup.admin(
        "POST", "/adapters", json={"name": "broken", "path": str(setup.dirs["no-weights"])}
    )
    error = refused.json()["error"]
    assert (refused.status_code, error["param"]) == (400, "path"), error
    assert "vLLM cannot load" in error["message"]
    with pytest.raises(openai.NotFoundError) as info:
        setup.answer("broken")
    assert info.value.code == "model_not_found"
    assert setup.answer("adapter-a") == before  # the worker serves on, adapters and all
