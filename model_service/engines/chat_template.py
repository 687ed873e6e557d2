"""A chat rendered as text through the model's Hugging Face chat template, for every engine
that serves a chat (vLLM, Triton): the worker owns the template."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

from model_service.errors import InvalidArgument
from model_service.types import GenerationRequest

# Requests larger than this (`input_chars`) are rendered and tokenized off the event loop.
INLINE_CHARS = 8192
_T = TypeVar("_T")


def render(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    request: GenerationRequest,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """`messages` (and `tools`), as the template takes them, rendered as the prompt text
    with the request's template inputs (generation prompt, an open final message,
    documents, extra variables); InvalidArgument naming `chat.messages` when the template
    refuses them. As vLLM merges them: the request's own fields win over the same names
    among the extra variables, documents only when it has some."""
    kwargs = {
        **(request.template_kwargs or {}),
        "add_generation_prompt": request.add_generation_prompt,
        "continue_final_message": request.continue_final_message,
    }
    if request.documents:
        kwargs["documents"] = list(request.documents)
    try:
        return str(tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs))
    except Exception as exc:  # a template may reject a role order, e.g. jinja raise_exception
        raise InvalidArgument(
            "chat.messages", f"chat template refused the messages: {exc}"
        ) from exc


def input_chars(request: GenerationRequest) -> int:
    """About how many characters the chat template and the tokenizer read: every text of
    the request, tool schemas and template variables as compact JSON. Never more than the
    start's bytes on the wire (a character is at least a byte; the contract carries those
    as JSON text), so a start under `core.MAY_WAIT_BYTES` never waits on a thread."""
    size = len(request.prompt or "")
    for m in request.messages or ():
        size += len(m.content) + sum(len(c.arguments) + len(c.name) for c in m.tool_calls)
    for t in request.tools:
        size += len(t.description) + (_json_chars(t.parameters) if t.parameters else 0)
    for d in request.documents:
        size += sum(len(k) + len(v) for k, v in d.items())
    if request.template_kwargs:
        size += _json_chars(request.template_kwargs)
    return size


async def inline_if_small(
    pool: Executor, fn: Callable[[GenerationRequest], _T], request: GenerationRequest
) -> _T:
    """`fn(request)` (a render, a tokenizing) here if the request is small, else in `pool`
    (the engine's tokenizer thread): on the loop it would hold every stream of the worker."""
    if input_chars(request) <= INLINE_CHARS:
        return fn(request)
    return await asyncio.get_running_loop().run_in_executor(pool, fn, request)


def _json_chars(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str))
