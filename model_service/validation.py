"""Request validation: every check names the offending field (INVALID_ARGUMENT)."""

from __future__ import annotations

import math

from model_service.config import Limits
from model_service.errors import InvalidArgument, NotFound
from model_service.types import GenerationRequest, ModelInfo

ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})


def validate_request(req: GenerationRequest, model: ModelInfo, limits: Limits) -> None:
    """Checks that need no tokenizer. Raises InvalidArgument / NotFound."""
    if len(req.request_id.encode()) > limits.max_request_id_bytes:
        raise InvalidArgument("request_id", f"longer than {limits.max_request_id_bytes} bytes")
    if req.model and req.model != model.id:
        raise NotFound(
            f"model {req.model!r} is not served here (serving {model.id!r})", field="model"
        )
    _validate_input(req, limits)
    _validate_sampling(req, model, limits)


def _validate_input(req: GenerationRequest, limits: Limits) -> None:
    if req.messages is not None:
        if not req.messages:
            raise InvalidArgument("chat.messages", "at least one message is required")
        if len(req.messages) > limits.max_messages:
            raise InvalidArgument("chat.messages", f"more than {limits.max_messages} messages")
        size = 0
        for i, m in enumerate(req.messages):
            if m.role not in ROLES:
                raise InvalidArgument(
                    f"chat.messages[{i}].role",
                    f"unknown role {m.role[:32]!r}; use one of {sorted(ROLES)}",
                )
            size += len(m.content.encode())
        if size > limits.max_prompt_bytes:
            raise InvalidArgument(
                "chat.messages", f"content exceeds {limits.max_prompt_bytes} bytes"
            )
        if not any(m.content for m in req.messages):
            raise InvalidArgument("chat.messages", "all messages are empty")
    else:
        prompt = req.prompt or ""
        if not prompt:
            raise InvalidArgument("prompt", "must not be empty")
        if len(prompt.encode()) > limits.max_prompt_bytes:
            raise InvalidArgument("prompt", f"exceeds {limits.max_prompt_bytes} bytes")


def _validate_sampling(req: GenerationRequest, model: ModelInfo, limits: Limits) -> None:
    sp = req.sampling
    if sp.max_tokens is not None and sp.max_tokens < 1:
        raise InvalidArgument("sampling.max_tokens", "must be at least 1")
    if sp.max_tokens is not None and sp.max_tokens >= model.max_model_len:
        raise InvalidArgument(
            "sampling.max_tokens",
            f"{sp.max_tokens} is not below the model's context window "
            f"of {model.max_model_len} tokens",
        )
    if not math.isfinite(sp.temperature) or not 0 <= sp.temperature <= 2:
        raise InvalidArgument("sampling.temperature", "must be in [0, 2]")
    if not math.isfinite(sp.top_p) or not 0 < sp.top_p <= 1:
        raise InvalidArgument("sampling.top_p", "must be in (0, 1]")
    if sp.top_k < 0:
        raise InvalidArgument("sampling.top_k", "must be >= 0 (0 = off)")
    for name in ("presence_penalty", "frequency_penalty"):
        v = getattr(sp, name)
        if not math.isfinite(v) or not -2 <= v <= 2:
            raise InvalidArgument(f"sampling.{name}", "must be in [-2, 2]")
    if not math.isfinite(sp.repetition_penalty) or sp.repetition_penalty <= 0:
        raise InvalidArgument("sampling.repetition_penalty", "must be > 0")
    if sp.n != 1:
        raise InvalidArgument("sampling.n", "only n = 1 is supported")
    if sp.logprobs is not None and sp.logprobs > 20:
        raise InvalidArgument("sampling.logprobs", "at most 20")
    if len(sp.stop) > limits.max_stop_strings:
        raise InvalidArgument("sampling.stop", f"at most {limits.max_stop_strings} stop strings")
    for i, s in enumerate(sp.stop):
        if not s:
            raise InvalidArgument(f"sampling.stop[{i}]", "must not be empty")
        if len(s) > limits.max_stop_length:
            raise InvalidArgument(
                f"sampling.stop[{i}]", f"longer than {limits.max_stop_length} characters"
            )
    if req.timeout_s is not None and req.timeout_s <= 0:
        raise InvalidArgument("timeout_ms", "must be positive")


def resolve_max_tokens(req: GenerationRequest, model: ModelInfo, prompt_tokens: int) -> int:
    """Fit max_tokens into the context window once the prompt is tokenized."""
    field = "chat.messages" if req.messages is not None else "prompt"
    room = model.max_model_len - prompt_tokens
    if room < 1:
        raise InvalidArgument(
            field,
            f"the input is {prompt_tokens} tokens, over the model's context window of "
            f"{model.max_model_len} tokens",
        )
    wanted = req.sampling.max_tokens
    if wanted is None:
        return min(model.default_max_tokens, room)
    if wanted > room:
        raise InvalidArgument(
            "sampling.max_tokens",
            f"{prompt_tokens} prompt tokens + max_tokens {wanted} exceed the model's context "
            f"window of {model.max_model_len} tokens",
        )
    return wanted
