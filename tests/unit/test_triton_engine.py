"""The triton engine's pure parts: what it refuses, and the vLLM backend's sampling JSON."""

from __future__ import annotations

import json

import pytest

from model_service.config import build_parser, config_from_args
from model_service.engines.triton.interface import sampling_json, unsupported_field
from model_service.types import ChatMessage, GenerationRequest, SamplingParams


def request(**sampling: object) -> GenerationRequest:
    return GenerationRequest(
        "r1",
        SamplingParams(**sampling),
        messages=(ChatMessage("user", "hi"),),  # type: ignore[arg-type]
    )


def test_a_plain_request_is_accepted() -> None:
    assert unsupported_field(request(max_tokens=5, temperature=0.5, stop=("x",), seed=3)) is None


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        ({"logprobs": 0}, "sampling.logprobs"),
        ({"n": 2}, "sampling.n"),
        ({"logit_bias": ((5, 1.0),)}, "sampling.logit_bias"),
    ],
)
def test_fields_it_cannot_honour_are_named(sampling: dict[str, object], field: str) -> None:
    assert unsupported_field(request(**sampling)) == field


def test_sampling_json_uses_vllm_names_and_defaults_max_tokens() -> None:
    sp = SamplingParams(temperature=0.0, top_k=5, stop=("END",), ignore_eos=True, min_tokens=2)
    assert json.loads(sampling_json(sp, 77)) == {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 5,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "ignore_eos": True,
        "min_tokens": 2,
        "min_p": 0.0,
        "max_tokens": 77,
        "stop": ["END"],
    }
    assert json.loads(sampling_json(SamplingParams(seed=9, max_tokens=4), 77))["seed"] == 9


def test_tools_structured_outputs_and_tool_history_are_refused_by_name() -> None:
    from model_service.types import StructuredOutput, Tool, ToolCall

    req = request()
    req.tools = (Tool("f"),)
    assert unsupported_field(req) == "tools"
    req = request()
    req.structured = StructuredOutput("json_object")
    assert unsupported_field(req) == "structured_output.json_object"
    req = request()
    req.messages = (ChatMessage("assistant", "", tool_calls=(ToolCall("c1", "f", "{}"),)),)
    assert unsupported_field(req) == "chat.messages.tool_calls"
    req = request(min_p=0.1, stop_token_ids=(7,))
    req.stream_usage = True
    assert unsupported_field(req) is None
    assert json.loads(sampling_json(req.sampling, 9))["stop_token_ids"] == [7]


def test_triton_flags_map_to_options() -> None:
    args = build_parser().parse_args(
        [
            "--engine",
            "triton",
            "--triton-url",
            "h:9",
            "--triton-model",
            "m",
            "--triton-tls-ca",
            "ca.pem",
            "--triton-health-interval",
            "0.5",
        ]
    )
    opts = config_from_args(args).engine.triton
    assert (opts.url, opts.model, opts.tls, opts.tls_ca, opts.health_interval_s) == (
        "h:9",
        "m",
        True,
        "ca.pem",
        0.5,
    )


async def test_a_large_prompt_is_tokenized_in_a_thread_a_small_one_here() -> None:
    """Past `chat_template.INLINE_CHARS` the render and the tokenizer run in a thread:
    on the loop they would hold every stream of the worker."""
    import threading

    from model_service.config import EngineConfig
    from model_service.engines import chat_template
    from model_service.engines.triton.engine import TritonEngine

    class Recording:  # the tokenizer's seam: records where it ran
        on_loop: list[bool] = []

        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            self.on_loop.append(threading.current_thread() is threading.main_thread())
            return [len(text)]

    engine = TritonEngine(EngineConfig(engine="triton"))
    engine._tokenizer = Recording()
    small = GenerationRequest("s", SamplingParams(), prompt="hello")
    large = GenerationRequest("l", SamplingParams(), prompt="x" * (chat_template.INLINE_CHARS + 1))
    assert [await engine.tokenize(r) for r in (small, large)] == [
        [5],
        [chat_template.INLINE_CHARS + 1],
    ]
    assert Recording.on_loop == [True, False]
