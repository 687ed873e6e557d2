"""The model interface of Triton's vLLM backend (triton-inference-server/vllm_backend,
`src/model.py`), as this engine speaks it: which request fields it carries, the
`sampling_parameters` JSON, and reading `text_output`, `finish_reason` and the counts
back from a response. What it cannot carry is refused by field name."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from model_service.errors import EngineError, Unavailable
from model_service.types import FinishReason, GenerationRequest, SamplingParams

FINISH_REASONS = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "abort": FinishReason.CANCELLED,
}
# Sampling fields sent to Triton as vLLM SamplingParams keys (same names).
SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "min_p",
)
# Fields this engine honours; any other field away from its default is refused.
REQUEST_FIELDS = frozenset(
    (
        "request_id",
        "sampling",
        "prompt",
        "messages",
        "add_generation_prompt",
        "model",
        "timeout_s",
        "prompt_token_ids",
        "trace_headers",  # Triton has its own tracing; the worker's spans cover the call
        "stream_usage",  # the worker's, not the engine's
        "tool_choice",  # meaningless without tools (refused)
        "tool_function",
        "parallel_tool_calls",
    )
)
SAMPLING_FIELDS = frozenset((*SAMPLING_KEYS, "max_tokens", "stop", "stop_token_ids", "n"))
OPTIONAL_FLAGS = ("return_finish_reason", "return_num_input_tokens", "return_num_output_tokens")


def unsupported_field(request: GenerationRequest) -> str | None:
    """The first field of the request this engine cannot honour, as the contract names it."""
    if request.tools:
        return "tools"
    if request.structured is not None:
        return request.structured.field
    for m in request.messages or ():
        if m.tool_calls or m.tool_call_id:
            return "chat.messages.tool_calls"
    for f in dataclasses.fields(request):
        if f.name not in REQUEST_FIELDS and getattr(request, f.name) != _default(f):
            return f.name
    sp = request.sampling
    for f in dataclasses.fields(sp):
        if f.name not in SAMPLING_FIELDS and getattr(sp, f.name) != _default(f):
            return f"sampling.{f.name}"
    if sp.n != 1:
        return "sampling.n"
    return None


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def sampling_json(sp: SamplingParams, default_max_tokens: int) -> str:
    """The `sampling_parameters` input: vLLM SamplingParams keys, as the vLLM backend reads."""
    params: dict[str, Any] = {k: getattr(sp, k) for k in SAMPLING_KEYS}
    if params["seed"] is None:
        del params["seed"]
    params["max_tokens"] = sp.max_tokens or default_max_tokens
    if sp.stop:
        params["stop"] = list(sp.stop)
    if sp.stop_token_ids:
        params["stop_token_ids"] = list(sp.stop_token_ids)
    return json.dumps(params)


def request_inputs(
    text: str, sp: SamplingParams, default_max_tokens: int, flags: tuple[str, ...]
) -> list[Any]:
    """The request's input tensors (`flags`: the optional outputs the model declares)."""
    import numpy as np
    from tritonclient.grpc import InferInput

    def tensor(name: str, dtype: str, value: Any) -> Any:
        t = InferInput(name, [1], dtype)
        t.set_data_from_numpy(np.array([value], dtype=np.object_ if dtype == "BYTES" else bool))
        return t

    inputs = [
        tensor("text_input", "BYTES", text.encode()),
        tensor("stream", "BOOL", True),
        tensor("exclude_input_in_output", "BOOL", True),
        tensor("sampling_parameters", "BYTES", sampling_json(sp, default_max_tokens).encode()),
    ]
    inputs.extend(tensor(name, "BOOL", True) for name in flags)
    return inputs


def failed(error: Any) -> Exception:
    """An error response from the model (the vLLM backend sends its exception's text)."""
    message = error.message() if hasattr(error, "message") else str(error)
    if "cancelled" in message.lower():
        return Unavailable(f"Triton cancelled the request: {message}", retry_after_s=1.0)
    return EngineError(f"Triton model failed the request: {message}")


def text_output(result: Any) -> str:
    out = result.as_numpy("text_output")
    if out is None or len(out) == 0:
        return ""
    value = out.reshape(-1)[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def scalar(result: Any, name: str) -> int | None:
    out = result.as_numpy(name)
    if out is None or out.size == 0:
        return None
    return int(out.reshape(-1)[0])


def finish_reason(result: Any, at_max_tokens: bool) -> FinishReason | None:
    """The end: the finish_reason output when returned, else Triton's final-response flag
    (LENGTH if max_tokens were produced)."""
    out = result.as_numpy("finish_reason")
    if out is not None and out.size:
        raw = out.reshape(-1)[0]
        reason = raw.decode() if isinstance(raw, bytes) else str(raw)
        if reason in FINISH_REASONS:
            return FINISH_REASONS[reason]
    final = result.get_response().parameters.get("triton_final_response")
    if final is not None and final.bool_param:
        return FinishReason.LENGTH if at_max_tokens else FinishReason.STOP
    return None
