"""The audit log's parts, in milliseconds: redaction by JSON pointers and regexes, a
stream's response as its events, a full queue that drops instead of waiting, rotation
by size."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import orjson
import pytest

from edge.obs.audit import REDACTED, AuditLog, Redaction, pointer, response_doc
from edge.obs.record import RequestRecord
from tests.waits import eventually

SCOPE = {"type": "http", "method": "POST", "headers": [(b"authorization", b"Bearer sk-x")]}


def test_pointers_and_regexes_redact_what_they_name_and_nothing_else():
    line = {
        "key": "a",
        "request": {
            "messages": [{"role": "user", "content": "c1"}, {"role": "tool", "content": "c2"}],
            "a/b": {"~k": "x"},
            "prompt": "call 555-1234 now",
        },
        "response": [{"choices": [{"delta": {"content": "555-9999"}}]}],
    }
    rules = [
        "/request/messages/*/content",
        "/request/a~1b/~0k",
        "/request/missing/0",
        r"\d{3}-\d{4}",
    ]
    assert Redaction(rules)(line) == {
        "key": "a",
        "request": {
            "messages": [
                {"role": "user", "content": REDACTED},
                {"role": "tool", "content": REDACTED},
            ],
            "a/b": {"~k": REDACTED},
            "prompt": f"call {REDACTED} now",
        },
        "response": [{"choices": [{"delta": {"content": REDACTED}}]}],
    }
    assert Redaction(["/request/messages/1"])({"request": {"messages": ["a", "b"]}}) == {
        "request": {"messages": ["a", REDACTED]}
    }
    with pytest.raises(ValueError):
        pointer("messages/0")


def test_a_response_is_its_json_or_its_stream_events():
    assert response_doc([b'{"a":', b"1}"]) == {"a": 1}
    sse = b'retry: 3000\nid: x.1\ndata: {"n":1}\n\nid: x.2\ndata: {"n":2}\n\n'
    sse += b": keep-alive\n\ndata: [DONE]\n\n"
    assert response_doc([sse[:20], sse[20:]]) == [{"n": 1}, {"n": 2}]
    assert response_doc([]) is None
    assert response_doc([b"not json"]) == "not json"


def record(i: int) -> RequestRecord:
    rec = RequestRecord(route="/v1/chat/completions", caller="a", status=200)
    rec.request_id = f"r{i}"
    return rec


def test_a_full_queue_drops_and_counts_without_waiting(tmp_path: Path):
    log = AuditLog(str(tmp_path / "audit.log"), queue_size=2)
    gate = threading.Event()
    real_write = log._write
    log._write = lambda data, n: (gate.wait(), real_write(data, n))
    log.submit(SCOPE, record(0), 0.1)  # the writer takes it and blocks on the gate
    eventually(lambda: log.queue.qsize() == 0, what="the writer took the first line")
    t0 = time.perf_counter()
    for i in range(1, 50):
        log.submit(SCOPE, record(i), 0.1)
    assert time.perf_counter() - t0 < 0.5  # never waited on the blocked writer
    assert (log.queue.qsize(), log.dropped) == (2, 47)
    gate.set()
    log.close()
    lines = [orjson.loads(x) for x in (tmp_path / "audit.log").read_bytes().splitlines()]
    assert [x["request_id"] for x in lines] == ["r0", "r1", "r2"]
    assert "sk-x" not in (tmp_path / "audit.log").read_text()
    assert "sluice_edge_audit_dropped_total 47" in log.render_metrics()


def test_the_file_rotates_by_size_keeping_its_backups(tmp_path: Path):
    path = tmp_path / "audit.log"
    log = AuditLog(str(path), max_bytes=1024, backups=2)
    for i in range(60):
        log.submit(SCOPE, record(i), 0.1)
        eventually(lambda: log.written == i + 1, what=f"line {i} written")  # noqa: B023
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock"))
    assert files == ["audit.log", "audit.log.1", "audit.log.2"]
    ids = []
    for name in ("audit.log.2", "audit.log.1", "audit.log"):
        data = (tmp_path / name).read_bytes()
        assert name == "audit.log" or len(data) > 1024
        ids += [orjson.loads(x)["request_id"] for x in data.splitlines()]
    assert ids == [f"r{i}" for i in range(60 - len(ids), 60)]  # the newest, in order
