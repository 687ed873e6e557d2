"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`): its request
as a chat generation. Turns become the chat path's messages (a `tool_use` block is an
assistant tool call, a `tool_result` block a `tool` message), its tools and tool choice the
chat path's, its sampling fields the chat path's reader (`schema.common`); from there the
generation is the chat one. Its events and whole answer: `edge.api.message_events`."""

from __future__ import annotations

from typing import Any

import orjson

from edge.api import constraints, fields
from edge.api.schema import MAX_STOP, UINT32_MAX, GenRequest, common, int_field
from edge.errors import invalid
from generated import sluice_pb2 as pb

_ROLES = ("user", "assistant")
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def _text_blocks(content: Any, param: str) -> str:
    """A string, or a list of text blocks, as one text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(param, "must be a string or a list of text blocks")
    texts = []
    for j, block in enumerate(content):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise invalid(f"{param}[{j}]", "only text blocks are supported here")
        if not isinstance(block.get("text"), str):
            raise invalid(f"{param}[{j}].text", "'text' must be a string")
        texts.append(block["text"])
    return "\n".join(texts)


def _tool_use(block: dict[str, Any], param: str) -> pb.ToolCall:
    call_id, name, given = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise invalid(param, "a tool_use block needs a string 'id' and 'name'")
    if not isinstance(given, dict):
        raise invalid(f"{param}.input", "'input' must be an object")
    return pb.ToolCall(id=call_id, name=name, arguments=orjson.dumps(given).decode())


def _tool_result(block: dict[str, Any], param: str) -> pb.ChatMessage:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise invalid(f"{param}.tool_use_id", "a tool_result block needs a string 'tool_use_id'")
    if block.get("is_error") is not None and not isinstance(block["is_error"], bool):
        raise invalid(f"{param}.is_error", "'is_error' must be a boolean")
    given = block.get("content")
    text = "" if given is None else _text_blocks(given, f"{param}.content")
    return pb.ChatMessage(role="tool", content=text, tool_call_id=call_id)


def _thinking(block: dict[str, Any], param: str) -> None:
    """A thinking block of an earlier answer, sent back: checked, not rendered (as
    Anthropic drops earlier turns' thinking from the context)."""
    key = "thinking" if block["type"] == "thinking" else "data"
    if not isinstance(block.get(key), str):
        raise invalid(f"{param}.{key}", f"'{key}' must be a string")


def _turn(msg: Any, param: str) -> list[pb.ChatMessage]:
    """One turn as chat messages: a user turn's tool results first (each a `tool`
    message), then its text; an assistant turn's text with its tool calls."""
    if not isinstance(msg, dict):
        raise invalid(param, "each message must be an object")
    role = msg.get("role")
    if role not in _ROLES:
        raise invalid(f"{param}.role", "role must be 'user' or 'assistant'")
    content = msg.get("content")
    if isinstance(content, str):
        return [pb.ChatMessage(role=role, content=content)]
    if not isinstance(content, list):
        raise invalid(f"{param}.content", "'content' must be a string or a list of blocks")
    texts: list[str] = []
    calls: list[pb.ToolCall] = []
    results: list[pb.ChatMessage] = []
    for j, block in enumerate(content):
        bparam = f"{param}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise invalid(f"{bparam}.text", "'text' must be a string")
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block, bparam))
        elif kind == "tool_result" and role == "user":
            results.append(_tool_result(block, bparam))
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            _thinking(block, bparam)
        else:
            raise invalid(
                f"{bparam}.type",
                f"content blocks of type {str(kind)[:32]!r} are not supported in a {role} "
                "turn (text; tool_use and thinking from the assistant; tool_result from "
                "the user)",
            )
    if texts or calls or not results:
        turn = pb.ChatMessage(role=role, content="\n".join(texts))
        turn.tool_calls.extend(calls)
        results.append(turn)
    return results


def _messages(body: dict[str, Any]) -> list[pb.ChatMessage]:
    given = body.get("messages")
    if not isinstance(given, list) or not given:
        raise invalid("messages", "'messages' must be a non-empty list")
    out: list[pb.ChatMessage] = []
    system = body.get("system")
    if system is not None:
        out.append(pb.ChatMessage(role="system", content=_text_blocks(system, "system")))
    for i, msg in enumerate(given):
        out.extend(_turn(msg, f"messages[{i}]"))
    return out


def _tools(body: dict[str, Any]) -> list[pb.Tool]:
    out = []
    for param, tool in constraints.tool_entries(body):
        if not isinstance(tool, dict) or tool.get("type", "custom") not in ("custom", None):
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise invalid(
                f"{param}.type", f"only custom tools are supported, not {str(kind)[:48]!r}"
            )
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise invalid(f"{param}.name", "a tool needs a 'name'")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise invalid(f"{param}.input_schema", "'input_schema' must be an object")
        fn = {"name": tool["name"], "description": tool.get("description"), "parameters": schema}
        out.append(constraints.function_tool(fn, param))
    return out


def _tool_choice(body: dict[str, Any], req: GenRequest) -> None:
    """Anthropic's `tool_choice` as the chat path's: auto, any (required), tool (a named
    function), none; `disable_parallel_tool_use` is `parallel_tool_calls: false`."""
    given = body.get("tool_choice")
    if given is None:
        return
    kind = given.get("type") if isinstance(given, dict) else None
    if not isinstance(kind, str):
        kind = None  # a list or an object is no type (and no key of _TOOL_CHOICES)
    if kind == "tool":
        value: Any = {"type": "function", "name": given.get("name")}
    elif kind in _TOOL_CHOICES:
        value = _TOOL_CHOICES[kind]
    else:
        raise invalid("tool_choice", "'tool_choice' must be of type auto, any, tool or none")
    req.tool_choice = constraints.tool_choice(value, bool(req.tools))
    parallel = given.get("disable_parallel_tool_use")
    if parallel is not None:
        if not isinstance(parallel, bool):
            raise invalid(
                "tool_choice.disable_parallel_tool_use",
                "'disable_parallel_tool_use' must be a boolean",
            )
        req.parallel_tool_calls = not parallel


def _output_format(body: dict[str, Any]) -> pb.StructuredOutput | None:
    """`output_config.format` (Anthropic's structured outputs: a JSON schema) as the chat
    path's constraint."""
    config = body.get("output_config")
    if config is None:
        return None
    if not isinstance(config, dict):
        raise invalid("output_config", "'output_config' must be an object")
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or "schema" not in fmt:
        raise invalid(
            "output_config.format", '\'format\' must be {"type": "json_schema", "schema": ...}'
        )
    wrapped = {"type": "json_schema", "json_schema": {"schema": fmt["schema"]}}
    return constraints.response_format({"response_format": wrapped})


def _stop_sequences(body: dict[str, Any]) -> list[str]:
    given = body.get("stop_sequences")
    if given is None:
        return []
    if not isinstance(given, list) or not all(isinstance(s, str) and s for s in given):
        raise invalid("stop_sequences", "'stop_sequences' must be a list of non-empty strings")
    if len(given) > MAX_STOP:
        raise invalid("stop_sequences", f"'stop_sequences' has more than {MAX_STOP} strings")
    return given


def _user(body: dict[str, Any]) -> str | None:
    metadata = body.get("metadata")
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise invalid("metadata", "'metadata' must be an object")
    user = metadata.get("user_id")
    if user is not None and (not isinstance(user, str) or len(user) > 256):
        raise invalid("metadata.user_id", "'user_id' must be a string of at most 256 characters")
    return user


def parse_messages(body: dict[str, Any], *, count: bool = False) -> GenRequest:
    """A /v1/messages body -> GenRequest (the chat path's), or a 400. `count`: a
    count_tokens body (no `max_tokens`)."""
    fields.check("messages", body)
    req = GenRequest(kind="messages", messages=_messages(body))
    common(body, req)  # model, temperature, top_p, top_k, stream: the chat path's reader
    req.max_tokens = int_field(body, "max_tokens", 1, UINT32_MAX)
    if req.max_tokens is None and not count:
        raise invalid("max_tokens", "'max_tokens' is required")
    req.stop = _stop_sequences(body)
    req.user = _user(body)
    req.tools = _tools(body)
    _tool_choice(body, req)
    req.structured = _output_format(body)
    # The prompt's ids come first: `message_start` reports its input tokens.
    req.return_token_ids = True
    return req
