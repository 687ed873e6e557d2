"""The Responses API request (`POST /v1/responses`) as a chat generation: `input` items
(messages, function calls and their outputs; replayed reasoning checked, left out),
`instructions`, `text.format`, function `tools`, `include` and `top_logprobs`, vLLM's
`enable_response_messages`; the fields the response echoes."""

from __future__ import annotations

from typing import Any

from edge.api import constraints, fields, nesting
from edge.api.schema import MAX_TOP_LOGPROBS, UINT32_MAX, GenRequest, common, int_field
from edge.errors import invalid
from generated import sluice_pb2 as pb

_ROLES = frozenset({"system", "developer", "user", "assistant"})
_ECHO = ("temperature", "top_p", "max_output_tokens", "instructions", "metadata", "user",
         "previous_response_id")  # fmt: skip
LOGPROBS = "message.output_text.logprobs"
# OpenAI's `include` values: the rest name what never appears here (reasoning, files,
# built-in tools, images), so they change nothing.
INCLUDABLE = frozenset(
    {
        LOGPROBS,
        "reasoning.encrypted_content",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
    }
)


def _text_of(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(param, "'content' must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(
            part.get("text"), str
        ):
            raise invalid(f"{param}[{j}]", "only text content parts are supported")
        texts.append(part["text"])
    return "\n".join(texts)


def _input(body: dict[str, Any]) -> list[pb.ChatMessage]:
    given = body.get("input")
    if isinstance(given, str):
        return [pb.ChatMessage(role="user", content=given)]
    if not isinstance(given, list) or not given:
        raise invalid("input", "'input' must be a string or a non-empty list of items")
    out: list[pb.ChatMessage] = []
    for i, item in enumerate(given):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(param, "each input item must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            if not isinstance(item.get("role"), str) or item["role"] not in _ROLES:
                raise invalid(f"{param}.role", f"role must be one of {sorted(_ROLES)}")
            text = _text_of(item.get("content"), f"{param}.content")
            out.append(pb.ChatMessage(role=item["role"], content=text))
        elif kind == "function_call":
            name, args = item.get("name"), item.get("arguments", "")
            if not isinstance(name, str) or not isinstance(args, str):
                raise invalid(param, "a function_call needs a 'name' and string 'arguments'")
            nesting.check_text(args, f"{param}.arguments")
            call = pb.ToolCall(id=str(item.get("call_id") or ""), name=name, arguments=args)
            if not (out and out[-1].role == "assistant" and not out[-1].content):
                out.append(pb.ChatMessage(role="assistant"))
            out[-1].tool_calls.append(call)
        elif kind == "reasoning":
            # A replayed history's reasoning (an OpenAI-shaped conversation continued
            # here): checked, not rendered, as OpenAI drops it from later turns' context.
            _reasoning_item(item, param)
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str) or not isinstance(item.get("call_id"), str):
                raise invalid(param, "a function_call_output needs 'call_id' and string 'output'")
            out.append(pb.ChatMessage(role="tool", content=output, tool_call_id=item["call_id"]))
        else:
            raise invalid(
                f"{param}.type", f"input items of type {str(kind)[:32]!r} are not supported"
            )
    return out


def _reasoning_item(item: dict[str, Any], param: str) -> None:
    for part_list in ("summary", "content"):
        parts = item.get(part_list)
        if parts is None:
            continue
        if not isinstance(parts, list) or not all(
            isinstance(p, dict) and isinstance(p.get("text"), str) for p in parts
        ):
            raise invalid(f"{param}.{part_list}", f"'{part_list}' must be a list of text parts")
    encrypted = item.get("encrypted_content")
    if encrypted is not None and not isinstance(encrypted, str):
        raise invalid(f"{param}.encrypted_content", "'encrypted_content' must be a string")


def _text_format(body: dict[str, Any]) -> pb.StructuredOutput | None:
    text = body.get("text")
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise invalid("text.format", "'format' must be an object")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return pb.StructuredOutput(json_object=True)
    if kind == "json_schema":
        if "schema" not in fmt:
            raise invalid("text.format.schema", "'schema' is required")
        wrapped = {"type": "json_schema", "json_schema": {"schema": fmt["schema"]}}
        return constraints.response_format({"response_format": wrapped})
    raise invalid("text.format.type", "'type' must be 'text', 'json_object' or 'json_schema'")


def _tools(body: dict[str, Any]) -> list[pb.Tool]:
    out = []
    for i, (_, tool) in enumerate(constraints.tool_entries(body)):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise invalid(f"tools[{i}].type", "only tools of type 'function' are supported")
        if not isinstance(tool.get("name"), str):
            raise invalid(f"tools[{i}].name", "a function tool needs a 'name'")
        out.append(constraints.function_tool(tool, f"tools[{i}]"))
    return out


def parse_responses(body: dict[str, Any]) -> GenRequest:
    """A /v1/responses body -> GenRequest, or a 400: `input` (a string, or messages,
    `function_call` and `function_call_output` items), `instructions` (a system message
    first), `max_output_tokens`, sampling, `text.format`, function `tools`, `tool_choice`,
    `parallel_tool_calls`."""
    fields.check("responses", body)
    messages = _input(body)
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid("instructions", "'instructions' must be a string")
        messages.insert(0, pb.ChatMessage(role="system", content=instructions))
    req = GenRequest(kind="responses", messages=messages)
    common(body, req)
    req.structured = _text_format(body)
    req.max_tokens = int_field(body, "max_output_tokens", 1, UINT32_MAX)
    req.tools = _tools(body)
    req.tool_choice = constraints.tool_choice(body.get("tool_choice"), bool(req.tools))
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid("parallel_tool_calls", "'parallel_tool_calls' must be a boolean")
    req.parallel_tool_calls = parallel
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise invalid("metadata", "'metadata' must be an object")
    req.echo = {name: body.get(name) for name in _ECHO}
    req.echo["tools"] = body.get("tools") or []
    req.echo["tool_choice"] = body.get("tool_choice") or "auto"
    req.echo["parallel_tool_calls"] = True if parallel is None else parallel
    req.echo["text"] = body.get("text") or {"format": {"type": "text"}}
    store = body.get("store")
    if store is not None and not isinstance(store, bool):
        raise invalid("store", "'store' must be a boolean")
    background = body.get("background")
    if background is not None and not isinstance(background, bool):
        raise invalid("background", "'background' must be a boolean")
    if background and store is False:  # as OpenAI and vLLM refuse it
        raise invalid("background", "background can only be used when `store` is true")
    # Kept only when asked (OpenAI's default is true); a background response always is.
    req.echo["store"] = bool(store or background)
    if background:
        req.echo["background"] = True
    _extras(body, req)
    return req


def _extras(body: dict[str, Any], req: GenRequest) -> None:
    """`include` (OpenAI's names; only the output's logprobs change the answer here:
    no reasoning, files or built-in tools), `top_logprobs`, and vLLM's
    `enable_response_messages` (the prompt and the output as text and token ids)."""
    include = body.get("include")
    if include is not None and (
        not isinstance(include, list) or not all(isinstance(v, str) for v in include)
    ):
        raise invalid("include", "'include' must be a list of strings")
    for i, name in enumerate(include or ()):
        if name not in INCLUDABLE:
            raise invalid(f"include[{i}]", f"'{name[:64]}' cannot be included")
    top = int_field(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if LOGPROBS in (include or ()):
        req.logprobs = top or 0
        req.echo["top_logprobs"] = req.logprobs
    messages = body.get("enable_response_messages")
    if messages is not None and not isinstance(messages, bool):
        raise invalid("enable_response_messages", "'enable_response_messages' must be a boolean")
    req.return_token_ids = req.return_prompt_text = bool(messages)
