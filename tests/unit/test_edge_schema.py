"""OpenAI request validation: every refusal is a 400 naming the parameter; conversion to
the contract keeps every field."""

from __future__ import annotations

from typing import Any

import pytest

from edge.api.schema import decode_body, parse_chat, parse_completion
from edge.errors import ApiError

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}


def chat(**over: Any) -> dict[str, Any]:
    return {**CHAT, **over}


def completion(**over: Any) -> dict[str, Any]:
    return {**COMPLETION, **over}


CHAT_CASES = [
    ({"model": "m"}, "messages"),
    (chat(messages="hi"), "messages"),
    (chat(messages=[]), "messages"),
    (chat(messages=["hi"]), "messages[0]"),
    (chat(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role"),
    (chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    (
        chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
        "messages[0].content[0]",
    ),
    (
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]),
        "messages[0].content[0].text",
    ),
    (chat(model=3), "model"),
    (chat(max_tokens=0), "max_tokens"),
    (chat(max_tokens="10"), "max_tokens"),
    (chat(max_tokens=True), "max_tokens"),
    (chat(max_tokens=1.5), "max_tokens"),
    (chat(max_completion_tokens=0), "max_completion_tokens"),
    (chat(temperature=-0.1), "temperature"),
    (chat(temperature=2.5), "temperature"),
    (chat(temperature="hot"), "temperature"),
    (chat(top_p=0), "top_p"),
    (chat(top_p=1.1), "top_p"),
    (chat(top_k=-2), "top_k"),
    (chat(seed="x"), "seed"),
    (chat(stop=5), "stop"),
    (chat(stop=[""]), "stop"),
    (chat(stop=["a"] * 17), "stop"),
    (chat(stop=["a", 1]), "stop"),
    (chat(presence_penalty=2.5), "presence_penalty"),
    (chat(frequency_penalty=-3), "frequency_penalty"),
    (chat(n=17), "n"),
    (chat(n=2, best_of=3), "best_of"),
    (chat(min_p=2), "min_p"),
    (chat(stop_token_ids=[1, -1]), "stop_token_ids"),
    (chat(logit_bias={"x": 1}), "logit_bias"),
    (chat(logit_bias={"5": 101}), "logit_bias"),
    (
        chat(stream=True, stream_options={"continuous_usage_stats": 1}),
        "stream_options.continuous_usage_stats",
    ),
    (chat(n=0), "n"),
    (chat(logprobs="yes"), "logprobs"),
    (chat(top_logprobs=3), "top_logprobs"),
    (chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    (chat(stream="yes"), "stream"),
    (chat(stream_options={"include_usage": True}), "stream_options"),
    (chat(stream=True, stream_options=[]), "stream_options"),
    (chat(stream=True, stream_options={"include_usage": "y"}), "stream_options.include_usage"),
    (chat(user=5), "user"),
    (chat(tools=[{"type": "function"}]), "tools[0].function.name"),
    (chat(tools={"type": "function"}), "tools"),
    (chat(tools=[{"type": "code_interpreter"}]), "tools[0].type"),
    (
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "{"}}]),
        "tools[0].function.parameters",
    ),
    (chat(tool_choice="required"), "tool_choice"),
    (chat(tool_choice="sometimes"), "tool_choice"),
    (chat(tool_choice={"type": "function"}), "tool_choice"),
    (chat(messages=[{"role": "tool", "content": "x"}]), "messages[0].tool_call_id"),
    (
        chat(messages=[{"role": "assistant", "tool_calls": [{"function": {}}]}]),
        "messages[0].tool_calls[0]",
    ),
    (chat(response_format={"type": "xml"}), "response_format.type"),
    (chat(response_format={"type": "json_schema"}), "response_format.json_schema"),
    (
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
        "response_format.json_schema.schema",
    ),
    (
        chat(response_format={"type": "json_schema", "json_schema": {"schema": 3}}),
        "response_format.json_schema.schema",
    ),
    (chat(structured_outputs={"choice": []}), "structured_outputs.choice"),
    (chat(structured_outputs={"regex": "a", "choice": ["b"]}), "structured_outputs.choice"),
    (chat(structured_outputs={"whatever": 1}), "structured_outputs.whatever"),
    (chat(guided_regex="a", response_format={"type": "json_object"}), "response_format"),
    (chat(functions=[{"name": "f"}]), "functions"),
    (chat(repetition_penalty=0), "repetition_penalty"),
]


@pytest.mark.parametrize(("body", "param"), CHAT_CASES)
def test_chat_refusals_name_the_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_chat(body)
    err = info.value
    assert err.status == 400
    assert err.param == param
    assert err.body()["error"]["param"] == param  # type: ignore[index]
    assert err.type == "invalid_request_error"


COMPLETION_CASES = [
    ({"model": "m"}, "prompt"),
    (completion(prompt=""), "prompt"),
    (completion(prompt=5), "prompt"),
    (completion(prompt=["a", ""]), "prompt[1]"),
    (completion(prompt=[1, -2, 3]), "prompt"),
    (completion(logprobs=21), "logprobs"),
    (completion(logprobs=True), "logprobs"),
    (completion(max_tokens=0), "max_tokens"),  # vLLM's: only with `echo`
    (completion(prompt_logprobs=-1), "prompt_logprobs"),
    (completion(prompt_logprobs=21), "prompt_logprobs"),
    (completion(prompt_logprobs=-2), "prompt_logprobs"),
    (completion(prompt_logprobs="1"), "prompt_logprobs"),
    (completion(prompt_logprobs=1, stream=True), "prompt_logprobs"),
    (completion(best_of=3), "best_of"),
    (completion(suffix="x"), "suffix"),
    (completion(max_tokens=-1), "max_tokens"),
]


@pytest.mark.parametrize(("body", "param"), COMPLETION_CASES)
def test_completion_refusals_name_the_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_completion(body)
    assert info.value.status == 400
    assert info.value.param == param


@pytest.mark.parametrize("raw", [b"{", b"[1, 2]", b'"text"', b"", b"NaN"])
def test_body_must_be_a_json_object(raw: bytes) -> None:
    with pytest.raises(ApiError) as info:
        parse_chat(decode_body(raw))
    assert info.value.status == 400
    assert info.value.param is None


def test_chat_conversion_keeps_every_field() -> None:
    req = parse_chat(
        chat(
            messages=[
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {"role": "assistant", "content": None},
            ],
            max_completion_tokens=7,
            max_tokens=99,
            temperature=0,
            top_p=0.5,
            top_k=40,
            seed=-1,
            stop="END",
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            n=1,
            logprobs=True,
            top_logprobs=3,
            stream=True,
            stream_options={"include_usage": True},
            user="u1",
        )
    )
    assert req.stream and req.include_usage and req.user == "u1"
    start = req.to_start("rid-1")
    assert start.request_id == "rid-1" and start.model == "m"
    assert [(m.role, m.content) for m in start.chat.messages] == [
        ("system", "be brief"),
        ("user", "a\nb"),
        ("assistant", ""),
    ]
    sp = start.sampling
    assert sp.max_tokens == 7  # max_completion_tokens wins over the deprecated max_tokens
    assert sp.HasField("temperature") and sp.temperature == 0
    assert sp.top_p == pytest.approx(0.5) and sp.top_k == 40
    assert sp.seed == 2**64 - 1  # negative seeds wrap into the contract's uint64
    assert list(sp.stop) == ["END"]
    assert sp.presence_penalty == pytest.approx(0.5)
    assert sp.frequency_penalty == pytest.approx(-0.5)
    assert sp.logprobs == 3
    assert sp.n == 1


def test_unset_fields_stay_unset() -> None:
    sp = parse_chat(dict(CHAT)).to_start("r").sampling
    for name in (
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "logprobs",
        "repetition_penalty",
    ):
        assert not sp.HasField(name), name
    assert list(sp.stop) == []


def test_top_k_minus_one_means_off() -> None:
    assert not parse_chat(chat(top_k=-1)).to_start("r").sampling.HasField("top_k")


def test_logprobs_without_top_asks_for_zero_alternatives() -> None:
    sp = parse_chat(chat(logprobs=True)).to_start("r").sampling
    assert sp.HasField("logprobs") and sp.logprobs == 0
    assert not parse_chat(chat(logprobs=False)).to_start("r").sampling.HasField("logprobs")


def test_completion_conversion() -> None:
    req = parse_completion(completion(prompt=["only one"], logprobs=2, stop=["x", "y"]))
    start = req.to_start("r")
    assert start.WhichOneof("input") == "prompt" and start.prompt == "only one"
    assert start.sampling.max_tokens == 16  # OpenAI's default for /v1/completions
    assert start.sampling.logprobs == 2
    assert list(start.sampling.stop) == ["x", "y"]


def test_model_may_be_omitted() -> None:
    assert parse_chat({"messages": CHAT["messages"]}).to_start("r").model == ""


def test_completions_echo_of_token_ids_asks_the_worker_for_the_prompts_text() -> None:
    """vLLM's `echo` of token-id prompts: the worker decodes them (`return_prompt_text`),
    not asked for a text prompt; with `max_tokens` 0, one token (vLLM's) and the prompt
    alone shown."""
    ids = parse_completion(completion(echo=True, prompt=[1, 2], max_tokens=0))
    text = parse_completion(completion(echo=True, prompt="hi"))
    got = [(r.to_start("r").return_prompt_text, r.max_tokens, r.prompt_only) for r in (ids, text)]
    assert got == [(True, 1, True), (False, 16, False)]
