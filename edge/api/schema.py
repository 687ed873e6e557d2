"""OpenAI request bodies: parsed, validated before the 200 (`ApiError` 400 naming `param`)
and converted to the contract. What needs the model (context window, tokens) is the
worker's to check; its INVALID_ARGUMENT comes back with the OpenAI field name."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal

from edge.api import constraints, fields, nesting, prompt_logprobs, prompts
from edge.api.priority import check_tier
from edge.api.prompts import Prompt
from edge.api.templates import template_inputs
from edge.errors import ApiError, invalid
from generated import sluice_pb2 as pb

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
MAX_STOP = 16  # the contract's limit
MAX_TOP_LOGPROBS = 20
UINT32_MAX = 2**32 - 1
UINT64_MASK = 2**64 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_MODEL_NAME = 256
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for /v1/completions
MAX_N = 16  # the contract's limit

Kind = Literal["chat", "completion", "responses", "messages"]


@dataclass(slots=True)
class GenRequest:
    """A validated OpenAI request, in the contract's terms."""

    kind: Kind
    model: str = ""
    messages: list[pb.ChatMessage] | None = None
    prompt: str | None = None
    prompt_tokens: list[int] | None = None  # a completions prompt given as token ids
    batch: list[Prompt] | None = None  # completions: several prompts (the first above)
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None  # top alternatives per token; None = no logprobs
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False  # usage in every chunk
    user: str | None = None
    service_tier: str | None = None  # OpenAI's; `edge.api.priority` maps it to a class
    n: int = 1
    min_p: float = 0.0
    stop_token_ids: list[int] = field(default_factory=list)
    logit_bias: dict[int, float] = field(default_factory=dict)
    structured: pb.StructuredOutput | None = None
    tools: list[pb.Tool] = field(default_factory=list)
    tool_choice: pb.ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # The chat template's inputs besides the messages (vLLM's fields; None = its default).
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    template_kwargs_json: str = ""
    documents: list[pb.Document] = field(default_factory=list)
    role: str = "assistant"  # of the reply: the final message's without a generation prompt
    echo_text: str = ""  # chat `echo`: the final message's content, put before the reply
    echo: dict[str, Any] = field(default_factory=dict)  # Responses API: fields it echoes
    return_token_ids: bool = False  # vLLM's: prompt and output token ids in the answer
    return_prompt_text: bool = False  # the prompt's text (after the template) in the answer
    # vLLM's prompt logprobs: asked of the worker (top alternatives), shown in the answer
    # (whole answers only: streamed chunks carry none, as vLLM's), completions `echo`.
    prompt_logprobs: int | None = None
    show_prompt_logprobs: bool = False
    echo_prompt: bool = False  # completions `echo`
    echo_decoded: bool = False  # ... of token-id prompts: their text from the worker
    prompt_only: bool = False  # ... with `max_tokens` 0: the prompt alone

    def prompts(self) -> list[Prompt]:
        """A completions request's prompts: the batch's, or its one."""
        if self.batch is not None:
            return self.batch
        return [(self.prompt or "") if self.prompt_tokens is None else self.prompt_tokens]

    def chat_input(self) -> pb.ChatInput:
        """The contract's ChatInput of a chat request (messages, tools, template inputs)."""
        chat = pb.ChatInput(
            messages=self.messages,
            tools=self.tools,
            template_kwargs_json=self.template_kwargs_json,
            documents=self.documents,
        )
        if self.tool_choice is not None:
            chat.tool_choice.CopyFrom(self.tool_choice)
        for name in ("parallel_tool_calls", "add_generation_prompt", "continue_final_message"):
            value = getattr(self, name)
            if value is not None:
                setattr(chat, name, value)
        return chat

    def to_start(
        self, request_id: str, *, timeout_ms: int = 0, detach_grace_ms: int = 0
    ) -> pb.StartGeneration:
        """The contract's StartGeneration for this request (simple mode).

        `detach_grace_ms` = 0: when the RPC ends early (the HTTP client left) the worker
        aborts the generation at once instead of keeping it for a `Resume`.
        """
        sp = pb.SamplingParams(
            stop=self.stop,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            n=self.n,
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            min_p=self.min_p,
            stop_token_ids=self.stop_token_ids,
            logit_bias=self.logit_bias,
        )
        optional = ("max_tokens", "temperature", "top_p", "top_k", "seed", "repetition_penalty")
        for name in (*optional, "logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                setattr(sp, name, value)
        start = pb.StartGeneration(
            request_id=request_id,
            model=self.model,
            sampling=sp,
            timeout_ms=timeout_ms,
            detach_grace_ms=detach_grace_ms,
            structured_output=self.structured,
            stream_usage=self.continuous_usage,
            return_prompt_tokens=self.return_token_ids,
            return_prompt_text=self.return_prompt_text or self.echo_decoded,
        )
        if self.messages is not None:
            start.chat.CopyFrom(self.chat_input())
        elif self.prompt_tokens is not None:
            start.prompt_tokens.ids.extend(self.prompt_tokens)
        else:
            start.prompt = self.prompt or ""
        return start


def decode_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body, or a 400 (invalid, or nested too deep: naming
    where)."""
    body = nesting.loads(raw, None)
    if not isinstance(body, dict):
        raise invalid(None, "request body must be a JSON object")
    return body


# -- field readers: each returns the value or raises a 400 naming the field --------------


def _int(body: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        else:
            raise invalid(name, f"'{name}' must be an integer")
    if not lo <= v <= hi:
        raise invalid(name, f"'{name}' must be between {lo} and {hi}, got {v}")
    return v


def _num(
    body: dict[str, Any], name: str, lo: float, hi: float, *, lo_open: bool = False
) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise invalid(name, f"'{name}' must be a number")
    if v < lo or v > hi or (lo_open and v == lo):
        bracket = "(" if lo_open else "["
        raise invalid(name, f"'{name}' must be in {bracket}{lo:g}, {hi:g}], got {v}")
    return float(v)


def _seed(body: dict[str, Any]) -> int | None:
    """`seed`: an int64 as vLLM takes it (carried as its two's complement in uint64). A
    float only when exact (|v| < 2**53): a larger one was rounded on its way here."""
    v = body.get("seed")
    if isinstance(v, float) and v.is_integer() and abs(v) >= 2**53:
        raise invalid("seed", f"'seed' must be an integer between {INT64_MIN} and {INT64_MAX}")
    seed = _int(body, "seed", INT64_MIN, INT64_MAX)
    return None if seed is None else seed & UINT64_MASK


def _bool(body: dict[str, Any], name: str) -> bool | None:
    v = body.get(name)
    if v is None or isinstance(v, bool):
        return v
    raise invalid(name, f"'{name}' must be a boolean")


def _str(body: dict[str, Any], name: str, max_len: int) -> str | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, str):
        raise invalid(name, f"'{name}' must be a string")
    if len(v) > max_len:
        raise invalid(name, f"'{name}' is longer than {max_len} characters")
    return v


def _stop(body: dict[str, Any]) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid("stop", "'stop' must be a string or a list of strings")
    if len(stops) > MAX_STOP:
        raise invalid("stop", f"'stop' has more than {MAX_STOP} strings")
    if any(s == "" for s in stops):
        raise invalid("stop", "'stop' strings must not be empty")
    return stops


def common(body: dict[str, Any], req: GenRequest) -> None:
    """Fields shared by both endpoints."""
    req.model = _str(body, "model", MAX_MODEL_NAME) or ""
    req.temperature = _num(body, "temperature", 0.0, 2.0)
    req.top_p = _num(body, "top_p", 0.0, 1.0, lo_open=True)
    top_k = _int(body, "top_k", -1, 2**31 - 1)
    req.top_k = None if top_k is None or top_k <= 0 else top_k  # -1 and 0 both mean off
    req.seed = _seed(body)
    req.stop = _stop(body)
    req.presence_penalty = _num(body, "presence_penalty", -2.0, 2.0) or 0.0
    req.frequency_penalty = _num(body, "frequency_penalty", -2.0, 2.0) or 0.0
    req.repetition_penalty = _num(body, "repetition_penalty", 0.0, 100.0, lo_open=True)
    req.min_tokens = _int(body, "min_tokens", 0, UINT32_MAX) or 0
    req.ignore_eos = bool(_bool(body, "ignore_eos"))
    req.n = _int(body, "n", 1, MAX_N) or 1
    best_of = _int(body, "best_of", 1, 128)
    if best_of is not None and best_of != req.n:
        raise invalid("best_of", "'best_of' is not supported (other than equal to 'n')")
    req.min_p = _num(body, "min_p", 0.0, 1.0) or 0.0
    req.stop_token_ids = constraints.token_ids(body)
    req.logit_bias = constraints.logit_bias(body)
    req.structured = constraints.structured(body)
    req.user = _str(body, "user", 256)
    req.service_tier = check_tier(_str(body, "service_tier", 16))
    req.stream = bool(_bool(body, "stream"))
    req.return_token_ids = bool(_bool(body, "return_token_ids"))
    opts = body.get("stream_options")
    if opts is not None:
        if not req.stream:
            raise invalid(
                "stream_options", "'stream_options' is only allowed when 'stream' is true"
            )
        if not isinstance(opts, dict):
            raise invalid("stream_options", "'stream_options' must be an object")
        for name in ("include_usage", "continuous_usage_stats"):
            if opts.get(name) is not None and not isinstance(opts[name], bool):
                raise invalid(f"stream_options.{name}", f"'{name}' must be a boolean")
        req.include_usage = bool(opts.get("include_usage"))
        req.continuous_usage = req.include_usage and bool(opts.get("continuous_usage_stats"))


def _content(msg: dict[str, Any], i: int) -> str:
    content = msg.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"messages[{i}].content", "content must be a string or a list of parts")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            raise invalid(f"messages[{i}].content[{j}]", "only text content parts are supported")
        text = part.get("text")
        if not isinstance(text, str):
            raise invalid(f"messages[{i}].content[{j}].text", "text must be a string")
        texts.append(text)
    return "\n".join(texts)


def _messages(body: dict[str, Any], roles: frozenset[str]) -> list[pb.ChatMessage]:
    messages = body.get("messages")
    if messages is None:
        raise invalid("messages", "'messages' is required")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "'messages' must be a non-empty list")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise invalid(f"messages[{i}]", "each message must be an object")
        role = msg.get("role")
        if not isinstance(role, str) or role not in roles:
            raise invalid(f"messages[{i}].role", f"role must be one of {sorted(roles)}")
        m = pb.ChatMessage(role=role, content=_content(msg, i))
        if role == "assistant":
            m.tool_calls.extend(constraints.tool_calls(msg, i))
        elif role == "tool":
            call_id = msg.get("tool_call_id")
            if not isinstance(call_id, str):
                raise invalid(f"messages[{i}].tool_call_id", "a tool message needs 'tool_call_id'")
            m.tool_call_id = call_id
        name = msg.get("name")
        if isinstance(name, str):
            m.name = name[:64]
        out.append(m)
    return out


def parse_chat(body: dict[str, Any], roles: Collection[str] = ()) -> GenRequest:
    """A /v1/chat/completions body -> GenRequest, or a 400. `roles`: those the workers'
    chat template defines beyond OpenAI's (`--chat-role`)."""
    fields.check("chat", body)
    known = ROLES.union(roles) if roles else ROLES
    req = GenRequest(kind="chat", messages=_messages(body, known))
    common(body, req)
    req.tools = constraints.tools(body)
    req.tool_choice = constraints.tool_choice(body.get("tool_choice"), bool(req.tools))
    req.parallel_tool_calls = _bool(body, "parallel_tool_calls")
    flags = ("add_generation_prompt", "continue_final_message", "echo")
    template_inputs(body, req, {name: _bool(body, name) for name in flags})
    mct = _int(body, "max_completion_tokens", 1, UINT32_MAX)
    req.max_tokens = mct if mct is not None else _int(body, "max_tokens", 1, UINT32_MAX)
    logprobs = _bool(body, "logprobs")
    top = _int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not logprobs:
        raise invalid("top_logprobs", "'top_logprobs' needs 'logprobs' set to true")
    req.logprobs = (top or 0) if logprobs else None
    prompt_logprobs.ask(body, req, (top or 0) if _bool(body, "echo") else None)
    req.return_prompt_text = bool(_bool(body, "return_prompt_text"))
    return req


def parse_completion(body: dict[str, Any]) -> GenRequest:
    """A /v1/completions body -> GenRequest, or a 400."""
    fields.check("completion", body)
    batch = prompts.read(body)
    req = GenRequest(kind="completion", batch=batch if len(batch) > 1 else None)
    if isinstance(batch[0], str):
        req.prompt = batch[0]
    else:
        req.prompt_tokens = batch[0]
    common(body, req)
    req.echo_prompt = bool(_bool(body, "echo"))
    req.echo_decoded = req.echo_prompt and not isinstance(batch[0], str)
    max_tokens = _int(body, "max_tokens", 0 if req.echo_prompt else 1, UINT32_MAX)
    if max_tokens == 0:  # vLLM's: the prompt alone (one token is generated, not shown)
        req.prompt_only, max_tokens = True, 1
    req.max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    req.logprobs = _int(body, "logprobs", 0, MAX_TOP_LOGPROBS)
    echoed = req.echo_prompt and req.logprobs is not None  # the prompt's tokens first
    prompt_logprobs.ask(body, req, req.logprobs if req.echo_prompt else None, echoed)
    return req


def int_field(body: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    """An integer parameter in [lo, hi], or None when absent (400 otherwise)."""
    return _int(body, name, lo, hi)


__all__ = [
    "ApiError",
    "GenRequest",
    "Kind",
    "decode_body",
    "parse_chat",
    "parse_completion",
]


def prompt_chars(req: GenRequest) -> int:
    """A completions request's prompt size in characters (token ids count 4 each), its
    batch's in all."""
    return sum(len(p) if isinstance(p, str) else 4 * len(p) for p in req.prompts())
