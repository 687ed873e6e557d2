"""JSON text from a caller (tool-call arguments, tool parameters, schemas), read with a
bound on its nesting: Python's parser raises RecursionError past ~1,000 levels, and what
reads the value next (chat templates, grammar compilers) recurses too. Past `MAX_DEPTH`
levels it is INVALID_ARGUMENT naming the field, never INTERNAL."""

from __future__ import annotations

import json
from typing import Any

from model_service.errors import InvalidArgument
from sluice_common.depth import deeper_than

# Levels of objects and arrays, the value itself the first (the edge bounds a whole
# request body at 64 levels).
MAX_DEPTH = 64


def _too_deep(field: str, limit: int) -> InvalidArgument:
    return InvalidArgument(field, f"nests deeper than {limit} levels of objects and arrays")


def loads(text: str, field: str, limit: int = MAX_DEPTH) -> Any:
    """The JSON value of `text`; InvalidArgument naming `field` when it is not JSON or
    nests deeper than `limit` levels."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise _too_deep(field, limit) from None
    except ValueError as exc:
        raise InvalidArgument(field, f"not valid JSON: {exc}") from None
    if deeper_than(value, limit):
        raise _too_deep(field, limit)
    return value


def check_maybe_json(text: str, field: str, limit: int = MAX_DEPTH) -> None:
    """Text that may be JSON (a history tool call's arguments: the engine passes them to
    the chat template as a value when they parse): refused only when it nests too deep."""
    if not text.lstrip().startswith(("[", "{")):
        return
    try:
        value = json.loads(text)
    except RecursionError:
        raise _too_deep(field, limit) from None
    except ValueError:
        return  # plain text, passed on as it is
    if deeper_than(value, limit):
        raise _too_deep(field, limit)
