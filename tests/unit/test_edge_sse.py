"""SSE encoding: exact bytes, and no model output can add an event or a field.

The decoder used as the reference is the official OpenAI SDK's (an independent parser),
so an encoder bug cannot hide behind a matching bug in our own parser.
"""

from __future__ import annotations

import orjson
import pytest
from openai._streaming import SSEDecoder

from edge.stream import sse
from tests.whatwg_sse import parse_events


def decode(raw: bytes) -> list[tuple[str | None, str, str | None]]:
    """(event, data, id) for every event the OpenAI SDK's decoder dispatches."""
    return [(e.event, e.data, e.id) for e in SSEDecoder().iter_bytes(iter([raw]))]


def test_plain_event_bytes() -> None:
    assert sse.encode_event("hello", id="7") == b"id: 7\ndata: hello\n\n"


def test_all_fields_in_order() -> None:
    raw = sse.encode_event("x", event="error", id="a1", retry_ms=3000)
    assert raw == b"event: error\nid: a1\nretry: 3000\ndata: x\n\n"
    assert decode(raw) == [("error", "x", "a1")]


@pytest.mark.parametrize(
    "text",
    [
        "line1\nline2",
        "line1\rline2",
        "line1\r\nline2",
        "\n\nevent: injected\ndata: evil\n\n",
        "a\r\rb\n\nc",
        "trailing newline\n",
    ],
)
def test_line_breaks_stay_inside_one_event(text: str) -> None:
    raw = sse.encode_event(text, id="1")
    events = decode(raw)
    assert len(events) == 1
    event, data, eid = events[0]
    assert event is None and eid == "1"
    # The client joins data lines with LF: CR and CRLF come back as LF, nothing is lost.
    assert data == text.replace("\r\n", "\n").replace("\r", "\n")
    assert raw.count(b"\n\n") == 1 and raw.endswith(b"\n\n")


@pytest.mark.parametrize(
    "text", [":comment-looking", "event: x", "id: 99", "retry: 1", "data: nested"]
)
def test_field_lookalikes_are_data(text: str) -> None:
    raw = sse.encode_event(text, id="5")
    assert decode(raw) == [(None, text, "5")]


def test_leading_colon_on_a_later_line_is_data() -> None:
    raw = sse.encode_event("first\n: not a comment", id="1")
    assert decode(raw) == [(None, "first\n: not a comment", "1")]


def test_leading_space_is_kept() -> None:
    assert decode(sse.encode_event("  two spaces", id="1")) == [(None, "  two spaces", "1")]


def test_nul_is_replaced_in_data_and_comments() -> None:
    raw = sse.encode_event("a\0b", id="1")
    assert b"\0" not in raw
    assert decode(raw) == [(None, "a\ufffdb", "1")]
    assert b"\0" not in sse.encode_comment("x\0y")


def test_empty_data_is_one_empty_event() -> None:
    assert decode(sse.encode_event("", id="1")) == [(None, "", "1")]


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\0b"])
def test_id_and_event_refuse_line_breaks_and_nul(bad: str) -> None:
    with pytest.raises(ValueError):
        sse.encode_event("x", id=bad)
    with pytest.raises(ValueError):
        sse.encode_event("x", event=bad)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10"])
def test_retry_must_be_a_non_negative_int(bad: object) -> None:
    with pytest.raises(ValueError):
        sse.encode_event("x", retry_ms=bad)  # type: ignore[arg-type]


def test_comment_is_never_an_event() -> None:
    raw = sse.encode_comment("keep-alive\ndata: injected\n\nevent: x")
    assert decode(raw) == []
    assert all(line.startswith(b":") for line in raw.split(b"\n") if line)
    # No blank line: that would end an (empty) event for decoders that keep the last id.
    assert raw.endswith(b"\n") and b"\n\n" not in raw


def test_fast_path_matches_general_encoder() -> None:
    payload = orjson.dumps({"text": "multi\nline\r\n\0 text", "n": 1})
    assert b"\n" not in payload  # JSON escapes control characters
    fast = sse.encode_data(payload, id=b"abc")
    assert fast == sse.encode_event(payload.decode(), id="abc")
    assert decode(fast) == [(None, payload.decode(), "abc")]


def test_fast_path_with_event_name() -> None:
    raw = sse.encode_data(b'{"error":{}}', id=b"9", event=b"error")
    assert raw == b'event: error\nid: 9\ndata: {"error":{}}\n\n'


@pytest.mark.parametrize("payload", [b"a\nevent: x\n\nb", b"a\rb", b"a\0b"])
def test_fast_path_falls_back_on_line_breaks(payload: bytes) -> None:
    raw = sse.encode_data(payload, id=b"1")
    events = decode(raw)
    assert len(events) == 1
    assert events[0][2] == "1"


def test_parse_events_round_trip() -> None:
    raw = (
        sse.encode_comment("hb")
        + sse.encode_event("a\nb", id="1", retry_ms=10)
        + sse.encode_event("[DONE]", id="2", event="done")
    )
    assert parse_events(raw) == [
        {"comment": "hb"},
        {"id": "1", "retry": "10", "data": "a\nb"},
        {"event": "done", "id": "2", "data": "[DONE]"},
    ]
