"""`deeper_than`: whether a parsed JSON value nests past a limit, walked a level at a time.
The edge and the worker check every large body and schema this way before anything
recurses into it; 128 tools of 25 KB (90,000 objects) took 40 ms walked node by node with
each node's path, 20 ms this way (a refusal looks for its path afterwards)."""

from __future__ import annotations

from typing import Any


def deeper_than(value: Any, limit: int) -> bool:
    """True when `value` holds objects or arrays more than `limit` levels deep, the value
    itself the first level (exact `dict` and `list`, as JSON parsers build them)."""
    level = [value] if value.__class__ is dict or value.__class__ is list else []
    for _ in range(limit):
        if not level:
            return False
        below: list[Any] = []
        add = below.extend
        for node in level:
            children = node.values() if node.__class__ is dict else node
            add([c for c in children if c.__class__ is dict or c.__class__ is list])
        level = below
    return bool(level)
