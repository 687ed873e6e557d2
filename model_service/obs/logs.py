"""Logging set-up: text for people, one JSON object per line for pipelines; the caller's
`x-request-id` is each record's `trace_id`, as in the edge's log."""

from __future__ import annotations

import logging

from sluice_common.contract import TRACE_KEY
from sluice_common.logs import TEXT_FORMAT, JsonFormatter


def setup_logging(level: str, fmt: str) -> None:
    """Configure the root logger: `fmt` is "text" or "json"."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def trace_id(metadata: object) -> str:
    """The caller's `x-request-id` from gRPC invocation metadata, or ""."""
    for item in metadata or ():  # type: ignore[attr-defined]
        if item[0] == TRACE_KEY:
            return str(item[1])[:128]
    return ""
