"""Logging set-up: plain text for people, one JSON object per line for log pipelines.

Per-generation records carry `request_id` and `trace_id` (the `x-request-id` gRPC metadata
the edge sends), so one request can be followed from the edge's log into the worker's.
"""

from __future__ import annotations

import json
import logging
import time

TRACE_METADATA_KEY = "x-request-id"
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "msg", ...extra fields}` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str, fmt: str) -> None:
    """Configure the root logger: `fmt` is "text" or "json"."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def trace_id(metadata: object) -> str:
    """The caller's `x-request-id` from gRPC invocation metadata, or ""."""
    for item in metadata or ():  # type: ignore[attr-defined]
        if item[0] == TRACE_METADATA_KEY:
            return str(item[1])[:128]
    return ""
