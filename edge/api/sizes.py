"""The edge's own size limits on a parsed request (`SecurityConfig`): the prompt, the
tools and a history tool call's arguments, each a 400 naming the field and the limit
before any worker is called; the most tokens a request may cost (`most_tokens`). What a
constraint may cost is the worker's to bound (`model_service.intake.bounds`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from edge.api.schema import GenRequest, prompt_chars
from edge.errors import ApiError

if TYPE_CHECKING:
    from edge.config import SecurityConfig


def check_sizes(req: GenRequest, body: dict[str, Any], limits: SecurityConfig) -> None:
    """400 naming the field when the prompt, the tools or a history tool call's arguments
    are larger than the edge's limits (`SecurityConfig`: 0 is no limit), before any worker
    is called."""
    _check_prompt(req, limits.max_prompt_chars)
    if len(req.tools) > limits.max_tools:
        raise _too_large("tools", f"'tools' has {len(req.tools)} entries", limits.max_tools)
    cap = limits.max_tools_chars
    size = sum(len(t.name) + len(t.description) + len(t.parameters_json) for t in req.tools)
    if cap and size > cap:
        raise _too_large("tools", f"the tool definitions hold {size} characters", cap)
    cap = limits.max_arguments_chars
    if cap and req.messages is not None:
        for param, text in _history_arguments(req, body):
            if len(text) > cap:
                raise _too_large(param, f"'{param}' holds {len(text)} characters", cap)


def _history_arguments(req: GenRequest, body: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """Each history tool call's arguments with its field's name: chat messages map one to
    one onto the body's, Messages `tool_use` blocks are named by their id, Responses
    `function_call` items are read from `input`."""
    if req.kind == "chat":
        for i, m in enumerate(req.messages or ()):
            for j, call in enumerate(m.tool_calls):
                yield f"messages[{i}].tool_calls[{j}].function.arguments", call.arguments
        return
    if req.kind == "messages":  # turns split into several messages: named by the call
        for m in req.messages or ():
            for call in m.tool_calls:
                yield f"messages (tool_use {call.id[:64]!r}).input", call.arguments
        return
    items = body.get("input")
    for i, item in enumerate(items if isinstance(items, list) else ()):
        if isinstance(item, dict) and item.get("type") == "function_call":
            yield f"input[{i}].arguments", item.get("arguments") or ""


def _too_large(param: str, what: str, limit: int) -> ApiError:
    return ApiError(
        400, f"{what}, more than this server's limit of {limit}", param=param, code="too_large"
    )


def _check_prompt(req: GenRequest, max_chars: int) -> None:
    """400 when the prompt is longer than `max_chars` characters (0: no limit)."""
    if max_chars <= 0:
        return
    if req.messages is not None:
        size, param = sum(len(m.content) for m in req.messages), "messages"
    else:  # token ids count about 4 characters each
        size, param = prompt_chars(req), "prompt"
    if size > max_chars:
        raise ApiError(
            400,
            f"'{param}' holds {size} characters, more than this server's limit of {max_chars}",
            param=param,
            code="prompt_too_long",
        )


# Tokens reserved against a tokens-per-minute limit for a request without max_tokens
# (its real usage settles it at the end).
UNBOUNDED_RESERVE = 1024


def most_tokens(req: GenRequest) -> int:
    """What a generation may cost at most, for a tokens-per-minute reservation: its
    max_tokens for each choice plus its prompt (about 4 characters a token); a batch's
    for each prompt."""
    if req.messages is not None:
        chars = sum(len(m.content) for m in req.messages)
    else:
        chars = prompt_chars(req)
    choices = max(1, req.n) * (len(req.batch) if req.batch else 1)
    return (req.max_tokens or UNBOUNDED_RESERVE) * choices + chars // 4 + 1
