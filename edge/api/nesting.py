"""How deep a client's JSON may nest. orjson reads 1,024 levels but writes only 254, and
the edge writes parts of a body again (schemas, tool parameters, Responses echoes): a body
is refused past `MAX_DEPTH` levels with a 400 naming where, before any of that."""

from __future__ import annotations

from typing import Any

import orjson

from edge.errors import invalid
from sluice_common.depth import deeper_than

# Levels of objects and arrays, the body itself the first. A JSON schema of 10 levels
# (OpenAI's own limit) inside a tool definition takes about 25.
MAX_DEPTH = 64
_SHOWN = 6  # path segments a refusal names


def too_deep(value: Any, limit: int = MAX_DEPTH) -> list[str] | None:
    """The path to the first container deeper than `limit` levels, or None."""
    stack: list[tuple[Any, int, list[str]]] = [(value, 1, [])]
    while stack:
        node, depth, path = stack.pop()
        if depth > limit:
            return path
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            if isinstance(child, dict | list):
                step = f"[{key}]" if isinstance(key, int) else f".{str(key)[:32]}"
                stack.append((child, depth + 1, [*path, step] if depth < _SHOWN else path))
    return None


def param_of(base: str | None, path: list[str]) -> str | None:
    """`base` and the path's first segments as a parameter name."""
    text = (base or "") + "".join(path)
    return text.lstrip(".") or None


def check_depth(value: Any, param: str | None, limit: int = MAX_DEPTH) -> None:
    """A 400 naming the field when `value` nests deeper than `limit` levels."""
    if not deeper_than(value, limit):
        return
    path = too_deep(value, limit)
    if path is not None:
        where = param_of(param, path)
        what = f"'{where}'" if where else "the request body"
        raise invalid(where, f"{what} nests deeper than {limit} levels of objects and arrays")


def loads(raw: bytes | str, param: str | None, limit: int = MAX_DEPTH) -> Any:
    """JSON text from a client, or a 400 naming `param`: invalid, or nested too deep."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        what = f"'{param}' is" if param else "request body is"
        raise invalid(param, f"{what} not valid JSON: {exc}") from None
    check_depth(value, param, limit)
    return value


def check_text(text: str, param: str, limit: int = MAX_DEPTH) -> None:
    """Text that may be JSON (a history tool call's arguments, passed on as text; the
    worker reads them when they parse): a 400 only when it nests too deep."""
    if not text.lstrip().startswith(("[", "{")):
        return
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc) or "ecursion" in str(exc):
            raise invalid(param, f"'{param}' nests deeper than {limit} levels") from None
        return  # plain text
    check_depth(value, param, limit)
