"""The audit log (`--audit-log PATH|-`): one JSON line per request (who, what, outcome,
tokens, latency, worker, trace id; with `--audit-bodies` an API call's bodies, redacted). `submit`
only queues (bounded: a full queue drops and counts, never waits); one writer thread
serializes, redacts, writes and rotates by size (processes share the file: O_APPEND,
rotation under a lock file). No header reaches a line: keys, cookies, Authorization never
do; routes are templates, so a stream link's capability neither."""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import logging
import os
import queue
import re
import sys
import threading
from collections.abc import Iterable
from typing import Any

import orjson
from starlette.types import Scope

from edge.obs.logs import TRACE_RE
from edge.obs.prom import Exposition
from edge.obs.record import RequestRecord

log = logging.getLogger("sluice.edge")
REDACTED = "[redacted]"
BATCH = 512  # lines written together at most
_STOP = object()
_DATA = re.compile(rb"^data: ?(.*)$", re.MULTILINE)


def pointer(text: str) -> list[str]:
    """A JSON pointer's reference tokens (RFC 6901: `~1` is `/`, `~0` is `~`)."""
    if not text.startswith("/"):
        raise ValueError(f"{text!r} is not a JSON pointer")
    return [t.replace("~1", "/").replace("~0", "~") for t in text[1:].split("/")]


def _at(doc: Any, tokens: list[str]) -> Any:
    """`doc` with what `tokens` point at replaced (`*`: every member or item)."""
    if not tokens:
        return REDACTED
    head, rest = tokens[0], tokens[1:]
    if isinstance(doc, dict):
        for k in list(doc) if head == "*" else [head] if head in doc else []:
            doc[k] = _at(doc[k], rest)
    elif isinstance(doc, list):
        if head == "*":
            idx = range(len(doc))
        elif head.isdigit() and int(head) < len(doc):
            idx = range(int(head), int(head) + 1)
        else:
            idx = range(0)
        for i in idx:
            doc[i] = _at(doc[i], rest)
    return doc


class Redaction:
    """`--audit-redact` rules: JSON pointers (a leading `/`) into the line, else regexes
    applied to every string of the bodies."""

    def __init__(self, rules: Iterable[str]) -> None:
        rules = list(rules)
        self.pointers = [pointer(r) for r in rules if r.startswith("/")]
        self.patterns = [re.compile(r) for r in rules if not r.startswith("/")]

    def __call__(self, line: dict[str, Any]) -> dict[str, Any]:
        for tokens in self.pointers:
            _at(line, tokens)
        if self.patterns:
            for part in ("request", "response"):
                if part in line:
                    line[part] = self._strings(line[part])
        return line

    def _strings(self, value: Any) -> Any:
        if isinstance(value, str):
            for p in self.patterns:
                value = p.sub(REDACTED, value)
            return value
        if isinstance(value, dict):
            return {k: self._strings(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._strings(v) for v in value]
        return value


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace")


def response_doc(parts: list[bytes]) -> Any:
    """A response's bytes as the line shows them: JSON, or an SSE stream's data payloads
    (each parsed when it is JSON; `[DONE]` left out)."""
    raw = b"".join(parts)
    if not raw.lstrip().startswith((b"data:", b"id:", b"retry:", b"event:", b":")):
        return _json(raw) if raw else None
    # The edge writes each event's data on one line (JSON has no raw newline).
    return [_json(d) for d in _DATA.findall(raw) if d != b"[DONE]"]


def _trace(scope: Scope, rec: RequestRecord) -> str:
    if rec.trace_id:
        return rec.trace_id
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            given = value.decode("latin-1")
            return given if TRACE_RE.fullmatch(given) else ""
    return ""


class AuditLog:
    """The writer of the audit log (see the module docstring)."""

    def __init__(
        self,
        path: str,
        *,
        bodies: bool = False,
        redact: Iterable[str] = (),
        max_bytes: int = 100 << 20,
        backups: int = 5,
        queue_size: int = 10_000,
    ) -> None:
        self.path = path
        self.bodies = bodies
        self.redaction = Redaction(redact)
        self.max_bytes = max_bytes
        self.backups = backups
        self.queue: queue.Queue[object] = queue.Queue(queue_size)
        self.written = 0
        self.dropped = 0  # the queue was full
        self.failed = 0  # lines a write failed for
        self._fd = -1
        self._thread = threading.Thread(target=self._run, name="audit writer", daemon=True)
        self._thread.start()

    # -- the request's side -----------------------------------------------------------

    def submit(self, scope: Scope, rec: RequestRecord, took_s: float) -> None:
        """Queue the line of one request (an `ObsMiddleware` sink); never waits."""
        item = (
            dt.datetime.now(dt.UTC),
            scope.get("method", ""),
            _trace(scope, rec),
            took_s,
            rec,
        )
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, then stop the writer (the lifespan's end)."""
        with contextlib.suppress(queue.Full):
            self.queue.put(_STOP, timeout=timeout)
        self._thread.join(timeout)

    # -- the writer thread ------------------------------------------------------------

    def line(self, item: Any) -> bytes:
        at, method, trace, took_s, rec = item
        doc: dict[str, Any] = {
            "ts": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "request_id": rec.request_id or None,
            "trace_id": trace or None,
            "key": rec.caller,
            "tenant": rec.tenant or rec.caller,
            "method": method,
            "route": rec.route,
            "model": rec.model or None,
            "status": rec.status,
            "finish": rec.finish and rec.finish.removeprefix("FINISH_REASON_").lower(),
            "prompt_tokens": rec.prompt_tokens,
            "cached_tokens": rec.cached_tokens,
            "completion_tokens": rec.completion_tokens,
            "latency_ms": round(took_s * 1000, 3),
            "bytes": rec.bytes_sent,
            "worker": rec.worker or None,
        }
        if self.bodies and rec.caller:  # API calls only (module docstring)
            raw = rec.request_body
            doc["request"] = None if raw is None else _json(raw)
            doc["response"] = response_doc(rec.response_body or [])
            doc = self.redaction(doc)
        return orjson.dumps(doc) + b"\n"

    def _run(self) -> None:
        stop = False
        while not stop:
            batch = [self.queue.get()]
            while len(batch) < BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            lines = []
            for item in batch:
                if item is _STOP:
                    stop = True
                    continue
                try:
                    lines.append(self.line(item))
                except Exception:  # a line must never stop the writer
                    self.failed += 1
                    log.exception("audit line failed")
            if lines:
                self._write(b"".join(lines), len(lines))
        if self._fd >= 0:
            os.close(self._fd)

    def _write(self, data: bytes, n: int) -> None:
        try:
            if self.path == "-":
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
            else:
                self._open()
                os.write(self._fd, data)  # O_APPEND: whole batches, never interleaved
                if os.fstat(self._fd).st_size > self.max_bytes:
                    self._rotate()
                    self._open()  # PATH is there again at once (for `tail -F`)
            self.written += n
        except OSError as exc:
            self.failed += n
            log.warning("audit log write failed: %s", exc)

    def _open(self) -> None:
        """Open the file (again, if another process rotated it away)."""
        if self._fd >= 0:
            try:
                if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:
                    return
            except FileNotFoundError:
                pass
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def _rotate(self) -> None:
        """PATH -> PATH.1 -> ... -> PATH.N (the oldest goes), under a lock file so that
        processes sharing the file rotate it once."""
        with open(self.path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if os.stat(self.path).st_ino != os.fstat(self._fd).st_ino:
                    return  # another process rotated it: `_open` follows next time
                if self.backups == 0:
                    os.truncate(self.path, 0)
                    return
                for i in range(self.backups - 1, 0, -1):
                    with contextlib.suppress(FileNotFoundError):
                        os.replace(f"{self.path}.{i}", f"{self.path}.{i + 1}")
                os.replace(self.path, f"{self.path}.1")
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def render_metrics(self) -> str:
        out = Exposition()
        for name, help_, value in (
            ("lines", "Audit lines written.", self.written),
            ("dropped", "Audit lines dropped: the writer's queue was full.", self.dropped),
            ("failed", "Audit lines lost to a failed write.", self.failed),
        ):
            out.family(f"sluice_edge_audit_{name}_total", "counter", help_, [("", value)])
        out.family(
            "sluice_edge_audit_queue", "gauge", "Audit lines waiting.", [("", self.queue.qsize())]
        )
        return out.text()
