"""An SSE parser that follows the WHATWG event-stream rules, for tests (the edge only
encodes). Independent of `edge.stream.sse`: it shares no code with the encoder."""

from __future__ import annotations

import re

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def parse_events(raw: bytes) -> list[dict[str, str]]:
    """Decode a complete SSE byte stream the way a browser does (for tests and tools).

    Returns one dict per dispatched event with `data` and, when set, `event`, `id`,
    `retry`; comments are returned as {"comment": text}.
    """
    events: list[dict[str, str]] = []
    text = raw.decode("utf-8", "replace")
    current: dict[str, str] = {}
    data: list[str] = []
    for line in _LINE_BREAK.split(text):
        if line == "":
            if data:
                current["data"] = "\n".join(data)
                events.append(current)
            current, data = {}, []
            continue
        if line.startswith(":"):
            events.append({"comment": line[1:].removeprefix(" ")})
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name in ("event", "retry"):
            current[name] = value
        elif name == "id" and "\0" not in value:
            current["id"] = value
    return events
