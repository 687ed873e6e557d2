"""A start as a domain request: protobuf in, pure functions (validation comes after)."""

from __future__ import annotations

from generated import sluice_pb2 as pb
from model_service.errors import InvalidArgument
from model_service.intake import nesting
from model_service.types import (
    ChatMessage,
    GenerationRequest,
    SamplingParams,
    StructuredOutput,
    Tool,
    ToolCall,
)

TOOL_MODES = {
    pb.TOOL_MODE_AUTO: "auto",
    pb.TOOL_MODE_NONE: "none",
    pb.TOOL_MODE_REQUIRED: "required",
}


def sampling_from_pb(sp: pb.SamplingParams) -> SamplingParams:
    """Apply the contract's defaults to the optional fields."""
    return SamplingParams(
        max_tokens=sp.max_tokens if sp.HasField("max_tokens") else None,
        temperature=sp.temperature if sp.HasField("temperature") else 1.0,
        top_p=sp.top_p if sp.HasField("top_p") else 1.0,
        top_k=sp.top_k if sp.HasField("top_k") else 0,
        seed=sp.seed if sp.HasField("seed") else None,
        stop=tuple(sp.stop),
        presence_penalty=sp.presence_penalty,
        frequency_penalty=sp.frequency_penalty,
        repetition_penalty=sp.repetition_penalty if sp.HasField("repetition_penalty") else 1.0,
        n=sp.n or 1,
        logprobs=sp.logprobs if sp.HasField("logprobs") else None,
        ignore_eos=sp.ignore_eos,
        min_tokens=sp.min_tokens,
        min_p=sp.min_p,
        stop_token_ids=tuple(sp.stop_token_ids),
        logit_bias=tuple(sorted(sp.logit_bias.items())),
        prompt_logprobs=sp.prompt_logprobs if sp.HasField("prompt_logprobs") else None,
    )


def _message_from_pb(m: pb.ChatMessage) -> ChatMessage:
    calls = tuple(ToolCall(c.id, c.name, c.arguments) for c in m.tool_calls)
    return ChatMessage(m.role, m.content, calls, m.tool_call_id, m.name)


def tools_from_pb(chat: pb.ChatInput) -> tuple[Tool, ...]:
    tools = []
    for i, t in enumerate(chat.tools):
        params = None
        if t.parameters_json:
            params = nesting.loads(t.parameters_json, f"chat.tools[{i}].parameters_json")
            if not isinstance(params, dict):
                raise InvalidArgument(
                    f"chat.tools[{i}].parameters_json", "must be a JSON Schema object"
                )
        tools.append(Tool(t.name, t.description, params))
    return tuple(tools)


def _chat_into(req: GenerationRequest, chat: pb.ChatInput) -> None:
    req.messages = tuple(_message_from_pb(m) for m in chat.messages)
    req.add_generation_prompt = (
        chat.add_generation_prompt if chat.HasField("add_generation_prompt") else True
    )
    if chat.HasField("continue_final_message"):
        req.continue_final_message = chat.continue_final_message
    else:  # the contract's older form: a final assistant message without a generation prompt
        req.continue_final_message = (
            not req.add_generation_prompt
            and bool(chat.messages)
            and chat.messages[-1].role == "assistant"
        )
    if chat.template_kwargs_json:
        kwargs = nesting.loads(chat.template_kwargs_json, "chat.template_kwargs_json")
        if not isinstance(kwargs, dict):
            raise InvalidArgument("chat.template_kwargs_json", "must be a JSON object")
        req.template_kwargs = kwargs
    req.documents = tuple(dict(d.fields) for d in chat.documents)
    req.tools = tools_from_pb(chat)
    which = chat.tool_choice.WhichOneof("choice")
    if which == "function":
        req.tool_choice, req.tool_function = "function", chat.tool_choice.function
    elif which == "mode":
        req.tool_choice = TOOL_MODES.get(chat.tool_choice.mode, "")
        if not req.tool_choice:
            raise InvalidArgument("chat.tool_choice.mode", "unknown tool mode")
    if chat.HasField("parallel_tool_calls"):
        req.parallel_tool_calls = chat.parallel_tool_calls


def structured_from_pb(so: pb.StructuredOutput) -> StructuredOutput | None:
    """The constraint, or None when no kind is set."""
    kind = so.WhichOneof("kind")
    if kind is None:
        return None
    value: str | tuple[str, ...]
    if kind == "choice":
        value = tuple(so.choice.choices)
    elif kind == "json_object":
        if not so.json_object:
            return None
        value = ""
    else:
        value = getattr(so, kind)
    return StructuredOutput(kind, value, so.disable_any_whitespace)


# The contract's priority as the admission's class index (0 high, 1 normal, 2 low).
_PRIORITY_CLASS = {pb.PRIORITY_HIGH: 0, pb.PRIORITY_NORMAL: 1, pb.PRIORITY_LOW: 2}


def priority_class(priority: pb.Priority) -> int:
    """The contract's priority as the admission's class (unset: normal)."""
    if not priority:
        return 1
    found = _PRIORITY_CLASS.get(priority)
    if found is None:
        raise InvalidArgument("priority", f"unknown priority {priority}")
    return found


def request_from_pb(start: pb.StartGeneration) -> GenerationRequest:
    """A StartGeneration as a domain request (validation happens separately)."""
    which = start.WhichOneof("input")
    if which is None:
        raise InvalidArgument("input", "set one of `chat`, `prompt` and `prompt_tokens`")
    req = GenerationRequest(
        request_id=start.request_id,
        sampling=sampling_from_pb(start.sampling),
        model=start.model,
        timeout_s=start.timeout_ms / 1000 if start.timeout_ms else None,
        stream_usage=start.stream_usage,
        return_prompt_tokens=start.return_prompt_tokens,
        prompt_text="" if start.return_prompt_text else None,
        tenant=start.tenant,
    )
    req.priority = priority_class(start.priority)
    if start.HasField("structured_output"):
        req.structured = structured_from_pb(start.structured_output)
    if which == "chat":
        _chat_into(req, start.chat)
    elif which == "prompt_tokens":
        req.prompt_token_ids = list(start.prompt_tokens.ids)
    else:
        req.prompt = start.prompt
    return req


def tokenize_request_from_pb(t: pb.TokenizeRequest) -> GenerationRequest:
    """A TokenizeRequest as a domain request carrying only the input."""
    start = pb.StartGeneration(model=t.model)
    if t.HasField("chat"):
        start.chat.CopyFrom(t.chat)
    elif t.HasField("prompt"):
        start.prompt = t.prompt
    return request_from_pb(start)
