"""`sluice_common.logs.JsonFormatter`: the one JSON log line of the worker and the edge."""

from __future__ import annotations

import json
import logging
import sys

from sluice_common.logs import JsonFormatter


def record(**extra: object) -> logging.LogRecord:
    rec = logging.getLogger("sluice.test").makeRecord(
        "sluice.test", logging.WARNING, __file__, 1, "took %d ms", (12,), None, extra=extra
    )
    rec.created, rec.msecs = 0.0, 7.0
    return rec


def test_a_record_is_one_line_of_its_fields_then_its_extra_fields() -> None:
    line = JsonFormatter().format(record(request_id="gen-1", tokens=3))
    assert "\n" not in line
    assert json.loads(line) == {
        "ts": "1970-01-01T00:00:00.007Z",
        "level": "warning",
        "logger": "sluice.test",
        "msg": "took 12 ms",
        "request_id": "gen-1",
        "tokens": 3,
    }


def test_uvicorns_colored_copy_and_private_fields_are_not_fields() -> None:
    out = json.loads(JsonFormatter().format(record(color_message="\x1b[1mx", _private=1)))
    assert "color_message" not in out and "_private" not in out


def test_an_exception_is_its_traceback_text() -> None:
    rec = record()
    try:
        raise ValueError("boom")
    except ValueError:
        rec.exc_info = sys.exc_info()
    out = json.loads(JsonFormatter().format(rec))
    assert out["exc"].startswith("Traceback") and "ValueError: boom" in out["exc"]
