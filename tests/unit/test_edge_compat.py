"""Drop-in for vLLM's OpenAI server (issue 24): the edge's answers to what vLLM's clients
send, checked field by field against what vLLM's request models do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from edge.api.fields import CHAT as CHAT_FIELDS
from edge.api.fields import COMPLETION, RESPONSES, Endpoint, readme_with_table
from edge.api.responses import parse_responses
from edge.api.schema import decode_body, parse_chat, parse_completion
from edge.errors import ApiError

PARSERS = {"chat": parse_chat, "completion": parse_completion, "responses": parse_responses}
_COMMON = {
    "add_special_tokens", "allowed_token_ids", "bad_words", "cache_salt", "ec_transfer_params",
    "echo", "frequency_penalty", "ignore_eos", "include_stop_str_in_output",
    "kv_transfer_params", "length_penalty", "logit_bias", "logprob_token_ids", "logprobs",
    "max_tokens", "min_p", "min_tokens", "mm_payload", "model", "n", "presence_penalty",
    "priority", "prompt_logprobs", "repetition_detection", "repetition_penalty", "request_id",
    "response_format", "return_mm_kwargs", "return_token_ids", "return_token_offsets",
    "return_tokens_as_token_ids", "routed_experts_prompt_start", "seed", "session_id",
    "skip_special_tokens", "spaces_between_special_tokens", "stop", "stop_token_ids",
    "stream", "stream_interval", "stream_options", "structured_outputs", "temperature",
    "thinking_token_budget", "top_k", "top_p", "truncate_prompt_tokens", "truncation_side",
    "use_beam_search", "user", "vllm_xargs", "watermarking",
}  # fmt: skip
VLLM_CHAT = _COMMON | {
    "add_generation_prompt", "chat_template", "chat_template_kwargs", "continue_final_message",
    "documents", "include_reasoning", "max_completion_tokens", "media_io_kwargs", "messages",
    "mm_processor_kwargs", "parallel_tool_calls", "reasoning_effort", "return_prompt_text",
    "tool_choice", "tools", "top_logprobs",
}  # fmt: skip
VLLM_COMPLETION = _COMMON | {"prompt", "prompt_embeds", "suffix"}
VLLM_RESPONSES = {
    "background", "cache_salt", "chat_template_kwargs", "ec_transfer_params",
    "enable_response_messages", "frequency_penalty", "ignore_eos", "include",
    "include_reasoning", "include_stop_str_in_output", "input", "instructions",
    "kv_transfer_params", "logit_bias", "max_output_tokens", "max_tool_calls",
    "media_io_kwargs", "metadata", "min_p", "mm_payload", "mm_processor_kwargs", "model",
    "parallel_tool_calls", "presence_penalty", "previous_input_messages",
    "previous_response_id", "priority", "prompt", "prompt_cache_key", "reasoning",
    "repetition_penalty", "request_id", "return_mm_kwargs", "seed", "service_tier",
    "session_id", "skip_special_tokens", "stop", "stop_token_ids", "store", "stream",
    "structured_outputs", "temperature", "text", "tool_choice", "tools", "top_k",
    "top_logprobs", "top_p", "truncation", "user", "vllm_xargs", "watermarking",
}  # fmt: skip

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def refusal(body: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_chat(decode_body(orjson.dumps(body)))
    return info.value


@pytest.mark.parametrize(
    "raw",
    [b"9223372036854775808", b"-9223372036854775809", b"18446744073709551615", b"-1e20"],
)
def test_seed_outside_int64_is_refused_naming_seed(raw: bytes) -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"seed":' + raw + b"}"
    with pytest.raises(ApiError) as info:
        parse_chat(decode_body(body))
    assert (info.value.status, info.value.param) == (400, "seed")
    assert "seed" in info.value.message


@pytest.mark.parametrize(
    ("seed", "carried"),
    [(2**63 - 1, 2**63 - 1), (-(2**63), 2**63), (-1, 2**64 - 1), (7.0, 7)],
)
def test_seed_inside_int64_is_carried_as_uint64(seed: int | float, carried: int) -> None:
    assert parse_chat(decode_body(orjson.dumps({**CHAT, "seed": seed}))).seed == carried


def test_logit_bias_error_names_every_bad_key() -> None:
    err = refusal({**CHAT, "logit_bias": {"x": 1, "5": 2, "-3": 1, "abc": 0}})
    assert (err.status, err.param) == (400, "logit_bias")
    assert "logit_bias" in err.message
    for key in ("'x'", "'-3'", "'abc'"):
        assert key in err.message
    assert "'5'" not in err.message


def test_logit_bias_bias_error_names_every_bad_key() -> None:
    err = refusal({**CHAT, "logit_bias": {"1": 101, "2": 0, "3": -200, "4": "x"}})
    assert (err.status, err.param) == (400, "logit_bias")
    assert all(f"'{k}'" in err.message for k in ("1", "3", "4"))
    assert "'2'" not in err.message


def test_readme_field_list_is_the_table() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert readme_with_table(readme) == readme
    stale = readme.replace("| `seed` | served |", "| `seed` | ignored |")
    assert readme_with_table(stale) != stale


def test_every_vllm_field_is_decided() -> None:
    # vLLM 0.32's request models' fields (ChatCompletionRequest, CompletionRequest,
    # ResponsesRequest).
    assert VLLM_CHAT - set(CHAT_FIELDS) == set()
    assert VLLM_COMPLETION - set(COMPLETION) == set()
    assert VLLM_RESPONSES - set(RESPONSES) == set()


def test_responses_take_vllms_structured_outputs_and_template_kwargs() -> None:
    """vLLM's Responses extensions, as on chat: `structured_outputs` (not with
    `text.format`: a 400 naming it, vLLM's text) and `chat_template_kwargs`."""
    body: dict[str, Any] = {"input": "hi", "structured_outputs": {"choice": ["a", "b"]}}
    req = parse_responses({**body, "chat_template_kwargs": {"enable_thinking": False}})
    assert req.structured is not None and list(req.structured.choice.choices) == ["a", "b"]
    assert orjson.loads(req.template_kwargs_json) == {"enable_thinking": False}
    with pytest.raises(ApiError) as info:
        parse_responses({**body, "text": {"format": {"type": "text"}}})
    assert (info.value.param, info.value.message) == (
        "structured_outputs",
        "Cannot specify both structured_outputs and text.format",
    )


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        ("chat", {**CHAT, "no_such_parameter": 1}, "no_such_parameter"),
        ("chat", {**CHAT, "use_beam_search": True}, "use_beam_search"),
        ("chat", {**CHAT, "skip_special_tokens": False}, "skip_special_tokens"),
        ("chat", {**CHAT, "continue_final_message": True}, "continue_final_message"),
        ("chat", {**CHAT, "add_generation_prompt": 1}, "add_generation_prompt"),
        ("chat", {**CHAT, "chat_template_kwargs": []}, "chat_template_kwargs"),
        ("chat", {**CHAT, "documents": [{"text": 1}]}, "documents[0]"),
        ("chat", {**CHAT, "length_penalty": 2}, "length_penalty"),
        ("chat", {**CHAT, "echo": 0}, "echo"),
        ("completion", {"prompt": "hi", "max_token": 3}, "max_token"),
        ("completion", {"prompt": "hi", "suffix": "x"}, "suffix"),
        ("responses", {"input": "hi", "n": 2}, "n"),
        ("responses", {"input": "hi", "store": "yes"}, "store"),
    ],
)
def test_fields_refused_by_name(endpoint: Endpoint, body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as info:
        PARSERS[endpoint](body)
    assert (info.value.status, info.value.param) == (400, param)


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("chat", {**CHAT, "use_beam_search": False, "skip_special_tokens": True}),
        ("chat", {**CHAT, "add_generation_prompt": True, "length_penalty": 1.0}),
        ("chat", {**CHAT, "metadata": {"a": "b"}, "store": True, "request_id": "x"}),
        ("chat", {**CHAT, "reasoning_effort": "low", "modalities": ["text"]}),
        ("completion", {"prompt": "hi", "echo": False, "suffix": ""}),
        ("responses", {"input": "hi", "store": False, "reasoning": {"effort": "low"}}),
    ],
)
def test_off_values_and_ignored_fields_pass(endpoint: Endpoint, body: dict[str, Any]) -> None:
    PARSERS[endpoint](body)


@pytest.mark.parametrize(
    ("prompt", "text", "ids"),
    [
        ("hi", "hi", None),
        (["hi"], "hi", None),
        ([1, 2, 3], None, [1, 2, 3]),
        ([[7, 0, 2**32 - 1]], None, [7, 0, 2**32 - 1]),
    ],
    ids=["string", "one-string-batch", "token-ids", "one-token-id-batch"],
)
def test_completion_prompt_forms_reach_the_contract(prompt: Any, text: Any, ids: Any) -> None:
    req = parse_completion(decode_body(orjson.dumps({"model": "m", "prompt": prompt})))
    start = req.to_start("r")
    if ids is None:
        assert (start.WhichOneof("input"), start.prompt) == ("prompt", text)
    else:
        assert (start.WhichOneof("input"), list(start.prompt_tokens.ids)) == ("prompt_tokens", ids)


@pytest.mark.parametrize(
    ("prompt", "says"),
    [
        (["a"] * 65, "batch of 65 prompts, more than 64"),
        (["a", [1]], "a list of strings or a list of token-id lists"),
        ([], "non-empty list of token ids"),
        ([1, -2], "non-empty list of token ids"),
        ([1, 2**32], "non-empty list of token ids"),
        ([1, True], "non-empty list of token ids"),
        ([1.0], "non-empty list of token ids"),
        ([[]], "non-empty list of token ids"),
        (5, "must be a string, a non-empty list of token ids"),
        ("", "must not be empty"),
    ],
)
def test_bad_completion_prompts_are_a_400_naming_prompt(prompt: Any, says: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_completion(decode_body(orjson.dumps({"model": "m", "prompt": prompt})))
    assert (info.value.status, info.value.param) == (400, "prompt")
    assert says in info.value.message


# What vllm-router 0.1.17 (`--policy round_robin`) sends an edge behind it for a plain
# chat and completions request (captured from the router): SGLang's fields at their off
# values. A 400 for any of them would fail every request through the router.
ROUTER_CHAT = {
    "model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
    "max_tokens": 3, "logprobs": False, "no_stop_trim": False, "ignore_eos": False,
    "continue_final_message": False, "skip_special_tokens": True,
    "separate_reasoning": True, "stream_reasoning": True, "return_hidden_states": False,
    "include_reasoning": True,
}  # fmt: skip
ROUTER_COMPLETION = {
    "model": "m", "prompt": "hi", "max_tokens": 3, "stream": False, "echo": False,
    "no_stop_trim": False, "ignore_eos": False, "skip_special_tokens": True,
    "return_hidden_states": False,
}  # fmt: skip


def test_what_routers_in_front_add_is_accepted_at_its_off_values() -> None:
    chat = parse_chat(decode_body(orjson.dumps(ROUTER_CHAT)))
    plain = parse_chat(decode_body(orjson.dumps({**CHAT, "stream": True, "max_tokens": 3})))
    assert chat.to_start("r") == plain.to_start("r")
    completion = parse_completion(decode_body(orjson.dumps(ROUTER_COMPLETION)))
    assert completion.prompt == "hi" and completion.max_tokens == 3
    for name in ("no_stop_trim", "return_hidden_states"):
        with pytest.raises(ApiError) as info:
            parse_chat(decode_body(orjson.dumps({**ROUTER_CHAT, name: True})))
        assert info.value.param == name
