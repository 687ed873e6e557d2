"""Edge logging: text, or one JSON object per line (`--log-format json`) with one access
record per request (`access_record`, logger `sluice.edge.access`). A `dictConfig` dict
that uvicorn applies in every process, so `--processes N` processes log alike."""

from __future__ import annotations

import copy
import logging
import re
import uuid
from typing import TYPE_CHECKING, Any

from starlette.types import Scope
from uvicorn.config import LOGGING_CONFIG

from sluice_common.logs import TEXT_FORMAT, JsonFormatter

if TYPE_CHECKING:
    from edge.obs.record import RequestRecord

TRACE_RE = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")
access_log = logging.getLogger("sluice.edge.access")


def log_config(fmt: str, level: str) -> dict[str, Any]:
    """dictConfig for the process and for uvicorn (`uvicorn.Config(log_config=...)`).

    text: uvicorn's own format for its loggers (as before), ours for the rest;
    json: everything, uvicorn's loggers included, through one JSON handler.
    """
    root = {"handlers": ["sluice"], "level": level.upper()}
    if fmt == "json":
        return {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {"json": {"()": JsonFormatter}},
            "handlers": {
                "sluice": {
                    "class": "logging.StreamHandler",
                    "formatter": "json",
                    "stream": "ext://sys.stderr",
                }
            },
            "root": root,
            "loggers": {
                "uvicorn": {"handlers": [], "propagate": True},
                "uvicorn.access": {"handlers": [], "propagate": True},
            },
        }
    cfg = copy.deepcopy(LOGGING_CONFIG)
    cfg["formatters"]["sluice"] = {"format": TEXT_FORMAT}
    cfg["handlers"]["sluice"] = {
        "class": "logging.StreamHandler",
        "formatter": "sluice",
        "stream": "ext://sys.stderr",
    }
    cfg["root"] = root
    return cfg


def access_record(scope: Scope, rec: RequestRecord, duration_s: float) -> dict[str, Any]:
    """The access record's fields: method, route (the template: stream-link capabilities
    never reach the log), status, duration (to a stream's last byte), bytes, the key's
    name, the client; `request_id` (the generation's, as the worker logs it) and
    `trace_id` (the client's X-Request-Id when usable, the worker's `trace_id` too)."""
    out: dict[str, Any] = {
        "method": scope["method"],
        "route": rec.route,
        "status": rec.status,
        "duration_ms": round(duration_s * 1000, 3),
        "bytes": rec.bytes_sent,
        "key": rec.caller,
        "client": (scope.get("client") or ("", 0))[0],
    }
    if rec.request_id:
        out["request_id"] = rec.request_id
        out["trace_id"] = rec.trace_id
        if rec.finish is not None:
            out["prompt_tokens"] = rec.prompt_tokens
            out["completion_tokens"] = rec.completion_tokens
            out["finish"] = rec.finish
        return out
    given = ""
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            given = value.decode("latin-1")
    out["request_id"] = uuid.uuid4().hex
    out["trace_id"] = given if TRACE_RE.fullmatch(given) else out["request_id"]
    return out
