"""Request validation: every check names the offending field (INVALID_ARGUMENT)."""

from __future__ import annotations

import math
import re

from model_service.config import LimitsConfig
from model_service.errors import InvalidArgument, NotFound
from model_service.intake import bounds, nesting
from model_service.types import GenerationRequest, ModelInfo, StructuredOutput

ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
MAX_N = 16
MAX_TOOLS = 128
MAX_STOP_TOKEN_IDS = 64
MAX_LOGIT_BIAS = 300
MAX_LOGPROBS = 20  # top alternatives per token, generated or prompt (vLLM's max_logprobs)
MAX_CHOICES = 1024
MAX_DOCUMENTS = 128
# apply_chat_template's own parameters: set through their request fields, never as
# template variables (vLLM refuses `chat_template` and `tokenize` there, and the template
# fails on the input's own names). `add_generation_prompt`, `continue_final_message` and
# `documents` may come there too, as vLLM takes them: the request's fields win
# (`engines/chat_template.py`).
TEMPLATE_PARAMETERS = frozenset(
    {
        "messages", "conversation", "tools", "chat_template", "tokenize", "padding",
        "truncation", "max_length", "return_tensors", "return_dict",
        "return_assistant_tokens_mask", "tokenizer_kwargs",
    }
)  # fmt: skip
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


# A request id goes back in the `x-sluice-accepted` header: a header value's characters.
REQUEST_ID = re.compile(r"[\x21-\x7e]*")


def validate_ids(request_id: str, tenant: str, limits: LimitsConfig) -> None:
    """A generation's or an embedding's request id and tenant."""
    if len(request_id.encode()) > limits.max_request_id_bytes:
        raise InvalidArgument("request_id", f"longer than {limits.max_request_id_bytes} bytes")
    if not REQUEST_ID.fullmatch(request_id):
        raise InvalidArgument("request_id", "printable ASCII only, no spaces (a UUID will do)")
    if len(tenant.encode()) > limits.max_request_id_bytes:
        raise InvalidArgument("tenant", f"longer than {limits.max_request_id_bytes} bytes")


def validate_request(req: GenerationRequest, model: ModelInfo, limits: LimitsConfig) -> None:
    """Checks that need no tokenizer. Raises InvalidArgument / NotFound."""
    validate_ids(req.request_id, req.tenant, limits)
    if req.model and req.model != model.id and req.adapter is None:
        raise NotFound(
            f"model {req.model[:200]!r} is not served here (serving {model.id!r})", field="model"
        )
    _validate_input(req, model, limits)
    _validate_sampling(req, model, limits)
    if req.structured is not None:
        validate_structured(req.structured, bounds_of(limits))
    _validate_tools(req, bounds_of(limits))


def _validate_input(req: GenerationRequest, model: ModelInfo, limits: LimitsConfig) -> None:
    if req.messages is not None:
        if not req.messages:
            raise InvalidArgument("chat.messages", "at least one message is required")
        if len(req.messages) > limits.max_messages:
            raise InvalidArgument("chat.messages", f"more than {limits.max_messages} messages")
        size = 0
        for i, m in enumerate(req.messages):
            if m.role not in ROLES and m.role not in limits.chat_roles:
                raise InvalidArgument(
                    f"chat.messages[{i}].role",
                    f"unknown role {m.role[:32]!r}; use one of {sorted(ROLES)}",
                )
            size += len(m.content.encode())
            for j, call in enumerate(m.tool_calls):
                field = f"chat.messages[{i}].tool_calls[{j}].arguments"
                nesting.check_maybe_json(call.arguments, field)
                size += len(call.arguments.encode())
        size += _validate_template_inputs(req)
        if size > limits.max_prompt_bytes:
            raise InvalidArgument(
                "chat.messages", f"content exceeds {limits.max_prompt_bytes} bytes"
            )
        # The template renders the tools' descriptions into the prompt too.
        size += sum(len(t.name) + len(t.description.encode()) for t in req.tools)
        if size > limits.max_prompt_bytes:
            raise InvalidArgument(
                "chat.tools",
                f"content with the tools' descriptions exceeds {limits.max_prompt_bytes} bytes",
            )
        if not any(m.content or m.tool_calls for m in req.messages):
            raise InvalidArgument("chat.messages", "all messages are empty")
    elif req.prompt is None and req.prompt_token_ids is not None:
        ids = req.prompt_token_ids
        if not ids:
            raise InvalidArgument("prompt_tokens", "must hold at least one token id")
        if model.vocab_size and max(ids) >= model.vocab_size:
            bad = next(i for i in ids if i >= model.vocab_size)
            raise InvalidArgument(
                "prompt_tokens",
                f"token id {bad} is outside the model's vocabulary of {model.vocab_size}",
            )
    else:
        prompt = req.prompt or ""
        if not prompt:
            raise InvalidArgument("prompt", "must not be empty")
        if len(prompt.encode()) > limits.max_prompt_bytes:
            raise InvalidArgument("prompt", f"exceeds {limits.max_prompt_bytes} bytes")


def _validate_template_inputs(req: GenerationRequest) -> int:
    """Checks of the chat template's other inputs; about their size in bytes."""
    if req.continue_final_message and req.add_generation_prompt:
        raise InvalidArgument(
            "chat.continue_final_message",
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        )
    if len(req.documents) > MAX_DOCUMENTS:
        raise InvalidArgument("chat.documents", f"at most {MAX_DOCUMENTS} documents")
    size = sum(len(k) + len(v) for d in req.documents for k, v in d.items())
    kwargs = req.template_kwargs or {}
    taken = sorted(TEMPLATE_PARAMETERS & kwargs.keys())
    if taken:
        raise InvalidArgument(
            "chat.template_kwargs_json",
            f"{', '.join(taken)}: the template's own parameters, not template variables",
        )
    if kwargs:
        size += len(repr(kwargs))
    return size


def _validate_sampling(req: GenerationRequest, model: ModelInfo, limits: LimitsConfig) -> None:
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
    if not 1 <= sp.n <= MAX_N:
        raise InvalidArgument("sampling.n", f"must be between 1 and {MAX_N}")
    if not math.isfinite(sp.min_p) or not 0 <= sp.min_p <= 1:
        raise InvalidArgument("sampling.min_p", "must be in [0, 1]")
    if len(sp.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidArgument("sampling.stop_token_ids", f"at most {MAX_STOP_TOKEN_IDS} ids")
    if len(sp.logit_bias) > MAX_LOGIT_BIAS:
        raise InvalidArgument("sampling.logit_bias", f"at most {MAX_LOGIT_BIAS} entries")
    for tid, bias in sp.logit_bias:
        if not math.isfinite(bias) or not -100 <= bias <= 100:
            raise InvalidArgument(f"sampling.logit_bias[{tid}]", "must be in [-100, 100]")
    for name in ("logprobs", "prompt_logprobs"):
        if (k := getattr(sp, name)) is not None and k > MAX_LOGPROBS:
            raise InvalidArgument(f"sampling.{name}", f"at most {MAX_LOGPROBS}")
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


def bounds_of(limits: LimitsConfig) -> bounds.Bounds:
    return bounds.Bounds(
        limits.max_schema_properties,
        limits.max_schema_enum_values,
        limits.max_constraint_chars,
        limits.max_regex_repeat,
        limits.max_grammar_rules,
    )


def validate_structured(so: StructuredOutput, cost: bounds.Bounds | None = None) -> None:
    """What can be checked without the grammar backend (which compiles it), and what it
    may cost (`cost`, default bounds when not given)."""
    cost = cost or bounds.Bounds()
    if so.kind == "json_schema":
        schema = nesting.loads(so.value, so.field)  # type: ignore[arg-type]
        if not isinstance(schema, dict | bool):
            raise InvalidArgument(so.field, "a JSON Schema is an object (or a boolean)")
        bounds.check_schema(schema, so.field, cost)
    elif so.kind == "choice":
        if not so.value or len(so.value) > MAX_CHOICES:
            raise InvalidArgument(so.field, f"between 1 and {MAX_CHOICES} choices")
        if any(not c for c in so.value):
            raise InvalidArgument(so.field, "choices must not be empty")
        bounds.check_text("".join(so.value), so.field, "characters of choices", cost)
    elif so.kind in ("regex", "grammar") and not so.value:
        raise InvalidArgument(so.field, "must not be empty")
    elif so.kind == "regex":
        bounds.check_regex(str(so.value), so.field, cost)
    elif so.kind == "grammar":
        bounds.check_grammar(str(so.value), so.field, cost)


def _validate_tools(req: GenerationRequest, cost: bounds.Bounds) -> None:
    if len(req.tools) > MAX_TOOLS:
        raise InvalidArgument("chat.tools", f"at most {MAX_TOOLS} tools")
    names = set()
    for i, tool in enumerate(req.tools):
        if tool.parameters is not None:
            bounds.check_schema(tool.parameters, f"chat.tools[{i}].parameters", cost)
        if not TOOL_NAME.fullmatch(tool.name):
            raise InvalidArgument(
                f"chat.tools[{i}].name", "1-64 letters, digits, underscores or dashes"
            )
        if tool.name in names:
            raise InvalidArgument(f"chat.tools[{i}].name", f"{tool.name!r} is defined twice")
        names.add(tool.name)
    if req.tool_choice in ("required", "function"):
        if not req.tools:
            raise InvalidArgument("chat.tool_choice", f"{req.tool_choice!r} needs `tools`")
        if req.structured is not None:
            raise InvalidArgument(
                "structured_output",
                "a structured output cannot be combined with a required or named tool choice "
                "(the tool call's schema is the constraint)",
            )
    if req.tool_choice == "function" and req.tool_function not in names:
        raise InvalidArgument(
            "chat.tool_choice.function", f"{req.tool_function[:64]!r} is not one of `tools`"
        )


def resolve_max_tokens(req: GenerationRequest, model: ModelInfo, prompt_tokens: int) -> int:
    """Fit max_tokens into the context window once the prompt is tokenized; a prompt of
    no tokens (whitespace to a tokenizer that drops it) is refused, as vLLM does."""
    field = "chat.messages" if req.messages is not None else "prompt"
    if req.prompt is None and req.messages is None:
        field = "prompt_tokens"
    if prompt_tokens < 1:
        raise InvalidArgument(field, "the input is no tokens once tokenized")
    room = model.max_model_len - prompt_tokens
    if room < 1:
        raise InvalidArgument(
            field,
            f"the input is {prompt_tokens} tokens, over the model's context window of "
            f"{model.max_model_len} tokens",
        )
    wanted = req.sampling.max_tokens
    if wanted is None:  # as vLLM's server: the rest of the context, under the cap if any
        return room if model.default_max_tokens <= 0 else min(model.default_max_tokens, room)
    if wanted > room:
        raise InvalidArgument(
            "sampling.max_tokens",
            f"{prompt_tokens} prompt tokens + max_tokens {wanted} exceed the model's context "
            f"window of {model.max_model_len} tokens",
        )
    return wanted
