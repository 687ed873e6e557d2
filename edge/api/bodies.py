"""A request body's pure steps (its JSON parse and depth walk, the fields, the size
limits), run in one thread of their own when the body is large. Those steps are CPU only
and hold the event loop for as long as they take: 128 tools of 25 KB (3.6 MB) took
~100 ms of it, and every stream the edge relayed meanwhile stalled. In the thread the loop
takes the GIL back every switch interval (5 ms); one thread, so large bodies are parsed
one at a time and never crowd the loop out between them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from edge.api.messages import parse_messages
from edge.api.responses import parse_responses
from edge.api.schema import GenRequest, Kind, decode_body, parse_chat, parse_completion
from edge.api.sizes import check_sizes

if TYPE_CHECKING:
    from edge.config import SecurityConfig

# Smaller bodies parse within ~1 ms: inline, where a hop to the thread would cost more.
OFF_LOOP_BYTES = 64 * 1024
_PARSERS: dict[str, Callable[[dict[str, Any]], GenRequest]] = {
    "completion": parse_completion,
    "responses": parse_responses,
    "messages": parse_messages,
}
_pool = ThreadPoolExecutor(1, thread_name_prefix="sluice-body")
T = TypeVar("T")


async def run(size: int, step: Callable[..., T], *args: Any) -> T:
    """`step(*args)` for a body of `size` bytes: in the parse thread when it is large."""
    if size < OFF_LOOP_BYTES:
        return step(*args)
    return await asyncio.get_running_loop().run_in_executor(_pool, step, *args)


async def decode(raw: bytes) -> dict[str, Any]:
    """`decode_body`: the body's JSON object, or a 400."""
    return await run(len(raw), decode_body, raw)


async def parse(kind: Kind, given: dict[str, Any], size: int, limits: SecurityConfig) -> GenRequest:
    """The endpoint's request from a decoded body of `size` bytes, within the edge's size
    limits (`check_sizes`), or a 400 naming the field."""
    return await run(size, _parse, kind, given, limits)


def _parse(kind: Kind, given: dict[str, Any], limits: SecurityConfig) -> GenRequest:
    if kind == "chat":
        req = parse_chat(given, limits.chat_roles)
    else:
        req = _PARSERS[kind](given)
    check_sizes(req, given, limits)
    return req
