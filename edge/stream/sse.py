"""SSE encoding, pure: values to wire bytes. Any string is safe as `data`: a CR, LF or CRLF
starts a new `data:` line, a NUL becomes U+FFFD, every line starts with a field name, so
model output never injects an event or a field. `id` and `event` are ours: a line break
or NUL in them is a ValueError."""

from __future__ import annotations

import re

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_FORBIDDEN_IN_FIELD = re.compile(r"[\r\n\0]")
REPLACEMENT = "\ufffd"
# A stream's response headers (nginx: do not buffer it).
HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def _lines(text: str) -> list[str]:
    """Split on every SSE line terminator (CRLF, CR, LF); NULs replaced."""
    if "\0" in text:
        text = text.replace("\0", REPLACEMENT)
    return _LINE_BREAK.split(text)


def _check_field(name: str, value: str) -> None:
    if _FORBIDDEN_IN_FIELD.search(value):
        raise ValueError(f"SSE {name} must not contain CR, LF or NUL: {value!r}")


def encode_event(
    data: str | None = None,
    *,
    event: str | None = None,
    id: str | None = None,
    retry_ms: int | None = None,
) -> bytes:
    """One event: optional `event:`, `id:`, `retry:` fields, data lines, blank line.

    `data=None` writes no data line; an event without data is not dispatched by clients,
    so it only sets `id`/`retry`. `data=""` is an event with empty data.
    """
    parts: list[str] = []
    if event is not None:
        _check_field("event", event)
        parts.append(f"event: {event}\n")
    if id is not None:
        _check_field("id", id)
        parts.append(f"id: {id}\n")
    if retry_ms is not None:
        if isinstance(retry_ms, bool) or not isinstance(retry_ms, int) or retry_ms < 0:
            raise ValueError(f"SSE retry must be a non-negative int: {retry_ms!r}")
        parts.append(f"retry: {retry_ms}\n")
    if data is not None:
        # Always "data: " with one space: the client strips exactly one leading space,
        # so data that itself begins with a space keeps it.
        parts.extend(f"data: {line}\n" for line in _lines(data))
    parts.append("\n")
    return "".join(parts).encode("utf-8", "replace")


def encode_data(data: bytes, *, id: bytes | None = None, event: bytes | None = None) -> bytes:
    """Fast path for one-line payloads already in bytes (JSON from orjson): no scan copy.

    JSON encoders escape control characters, so the payload is one line; it is still
    checked (a byte search, not a copy) and anything else falls back to `encode_event`.
    """
    eid = id or b""
    if b"\n" in data or b"\r" in data or b"\0" in data or b"\n" in eid or b"\r" in eid:
        return encode_event(
            data.decode("utf-8", "replace"),
            id=id.decode("utf-8", "replace") if id is not None else None,
            event=event.decode("utf-8", "replace") if event is not None else None,
        )
    head = b"event: " + event + b"\n" if event is not None else b""
    if id is not None:
        head += b"id: " + id + b"\n"
    return head + b"data: " + data + b"\n\n"


def encode_comment(text: str = "") -> bytes:
    """A comment (heartbeat): ignored by clients, keeps proxies and idle timers alive.

    Comment lines only, with no blank line after them: a blank line is an event's end,
    and decoders that keep the last `id:` across events (the `openai` SDK's) dispatch an
    event with empty data on it, which the SDK then fails to parse as JSON. Written only
    between events, so the next event's fields simply follow the comment lines.
    """
    return "".join(f": {line}\n" for line in _lines(text)).encode("utf-8", "replace")
