"""Golden whole-stream transcripts: one SSE body per format, through a real sim worker and
a real edge, compared byte for byte with `tests/golden/<name>.sse`. Field-by-field tests
check what they think of; a transcript also catches a field renamed, an event reordered,
a comment or `retry:` moved, a byte of framing changed.

Deterministic settings: greedy or seeded sampling, the sim's prefix cache off (so
`cached_tokens` does not depend on earlier requests), a token every 30 ms (the worker
merges tokens only into a message its reader has not taken yet: at that pace none),
heartbeats far apart (no comment in a transcript), passive failure marking off (the
error transcript does not take the worker out for the next), one worker.

Normalized before the comparison, and nothing else:
- signed event ids: the stream token of each `id:` line (the part before
  `.<seq>.<cursor>[~<part>]`, which is kept) and of an error's `"last_event_id"`, as
  `<stream-N>`;
- ids: runs of 24 to 32 lowercase hex digits (the request id inside `chatcmpl-`, `cmpl-`,
  `resp_` and `msg_` ids; tool call ids), as `<id-N>`;
- timestamps: the values of `"created"` and `"created_at"`, as `<time>` (each first
  checked to be a second of this test's run).
N numbers distinct values in order of first appearance, so what was equal stays equal.

`SLUICE_UPDATE_GOLDEN=1` writes the files from this run instead of comparing them (then
read the diff); a normal run never does.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.edge_fixtures import Stack, parse_sse, stack

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
UPDATE = os.environ.get("SLUICE_UPDATE_GOLDEN") == "1"

MESSAGES = [{"role": "user", "content": "Tell me about rivers and the sea."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

_EVENT_ID = re.compile(rb'(?m)(^id: |"last_event_id":")([A-Za-z0-9_-]+)(?=\.\d+\.\d+)')
_HEX_ID = re.compile(rb"(?<![0-9a-f])[0-9a-f]{24,32}(?![0-9a-f])")
_TIME = re.compile(rb"(\"(?:created|created_at)\":)(\d+)")


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Path]]:
    faults = tmp_path_factory.mktemp("golden") / "faults.json"
    faults.write_text("")
    worker = ("--sim-token-delay", "0.03", "--sim-ttft", "0", "--sim-answer-tokens", "6",
              "--no-sim-prefix-cache", "--sim-fault-file", str(faults))  # fmt: skip
    with stack(worker, ("--heartbeat", "60", "--max-fails", "0")) as s:
        yield s, faults


def _numbered(pattern: re.Pattern[bytes], raw: bytes, label: str, group: int) -> bytes:
    """Each distinct match of `group` as `<label-N>`, N in order of first appearance."""
    seen: dict[bytes, int] = {}

    def name(m: re.Match[bytes]) -> bytes:
        n = seen.setdefault(m.group(group), len(seen) + 1)
        return m.group(0).replace(m.group(group), b"<%s-%d>" % (label.encode(), n))

    return pattern.sub(name, raw)


def normalize(raw: bytes, t0: float, t1: float) -> bytes:
    """The body with only ids, timestamps and signed event ids replaced (docstring)."""
    for m in _TIME.finditer(raw):
        assert int(t0) <= int(m.group(2)) <= int(t1) + 1, m.group(0)
    out = _numbered(_EVENT_ID, raw, "stream", 2)
    out = _numbered(_HEX_ID, out, "id", 0)
    return _TIME.sub(rb"\1<time>", out)


def post(s: Stack, path: str, body: dict[str, Any], **headers: str) -> tuple[bytes, float]:
    """The whole streamed body (status 200, SSE) and the time the request was sent."""
    t0 = time.time()
    with httpx.stream("POST", f"{s.base}{path}", json=body, headers=headers, timeout=60) as r:
        raw = r.read()
    assert r.status_code == 200, raw[:300]
    assert r.headers["content-type"].startswith("text/event-stream")
    return raw, t0


def check(name: str, raw: bytes, t0: float) -> None:
    """`raw`, normalized, is `tests/golden/<name>.sse` byte for byte (or becomes it)."""
    got = normalize(raw, t0, time.time())
    path = GOLDEN / f"{name}.sse"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_bytes(got)
        return
    want = path.read_bytes()
    diff = difflib.unified_diff(
        want.decode().splitlines(), got.decode().splitlines(), "golden", "this run", lineterm=""
    )
    assert got == want, f"{path.name} differs:\n" + "\n".join(diff)


CHAT = "/v1/chat/completions"
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": (
        CHAT,
        {"messages": MESSAGES, "max_tokens": 12, "temperature": 0, "stream": True,
         "stream_options": {"include_usage": True}},
    ),
    "completions": (
        "/v1/completions",
        {"prompt": "Rivers run to the sea", "max_tokens": 4, "temperature": 0, "stream": True},
    ),
    "responses": (
        "/v1/responses",
        {"input": "Tell me about rivers.", "instructions": "Be brief.", "max_output_tokens": 12,
         "temperature": 0, "stream": True},
    ),
    "chat_n2": (
        CHAT,
        {"messages": MESSAGES, "max_tokens": 4, "n": 2, "temperature": 1.0, "seed": 7,
         "stream": True},
    ),
    "chat_named_tool": (
        CHAT,
        {"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 40,
         "temperature": 0, "tools": [WEATHER],
         "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
         "stream": True},
    ),
    "messages": (
        "/v1/messages",
        {"model": "", "system": "Be brief.", "messages": MESSAGES, "max_tokens": 6,
         "temperature": 0, "stream": True},
    ),
    "messages_named_tool": (
        "/v1/messages",
        {"model": "", "messages": [{"role": "user", "content": "Weather in Paris?"}],
         "max_tokens": 40, "temperature": 0, "stream": True,
         "tools": [{"name": "get_weather", "description": "The weather in a city",
                    "input_schema": WEATHER["function"]["parameters"]}],  # type: ignore[index]
         "tool_choice": {"type": "tool", "name": "get_weather"}},
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_a_stream_is_its_golden_transcript(sim: tuple[Stack, Path], name: str) -> None:
    s, _ = sim
    path, body = CASES[name]
    raw, t0 = post(s, path, body)
    check(name, raw, t0)


@pytest.mark.parametrize(
    ("name", "path", "body"),
    [("chat_error_after_200", CHAT, {}), ("messages_error_after_200", "/v1/messages",
                                           {"model": "", "max_tokens": 8})],
    ids=["chat", "messages"],
)  # fmt: skip
def test_an_error_after_the_200_is_its_golden_transcript(
    sim: tuple[Stack, Path], name: str, path: str, body: dict[str, Any]
) -> None:
    """The worker fails after 3 tokens (the sim's injected fault): the tokens, then one
    `event: error` without an id (in the API's own error shape), and no `[DONE]`."""
    s, faults = sim
    faults.write_text(json.dumps({"error_rate": 1.0, "error_after_tokens": 3}))
    try:
        raw, t0 = post(s, path, {"messages": MESSAGES, "max_tokens": 8, "temperature": 0,
                                 "stream": True, **body})  # fmt: skip
    finally:
        faults.write_text("")
    check(name, raw, t0)


def test_a_resumed_stream_is_its_golden_transcript(sim: tuple[Stack, Path]) -> None:
    """A whole stream, then the same request with the Last-Event-ID of its third token:
    the rest of the stream, from the generation's replay log."""
    s, _ = sim
    body = {"messages": MESSAGES, "max_tokens": 6, "temperature": 0, "stream": True}
    whole, t0 = post(s, CHAT, body)  # its time: the resumed chunks keep the generation's
    ids = [e["id"] for e in parse_sse(whole) if "id" in e]
    raw, _ = post(s, CHAT, body, **{"Last-Event-ID": ids[3]})
    check("chat_resume", raw, t0)
