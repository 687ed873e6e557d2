"""Property-based tests of the SSE encoder (hypothesis): whatever the model writes, each
event decodes to exactly itself, by a parser that follows the WHATWG rules and by the
official `openai` SDK's decoder, with heartbeats anywhere between events (issue 12)."""

from __future__ import annotations

import re

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder

from edge.stream import sse
from tests.whatwg_sse import parse_events

# Model output: any text, with the characters that matter to SSE over-represented.
PIECES = st.one_of(
    st.sampled_from(["\n", "\r", "\r\n", "\0", ":", " ", "data:", "id:", "event:", "é"]),
    st.characters(blacklist_categories=("Cs",)),  # detokenized text is valid Unicode
)
TEXT = st.lists(PIECES, max_size=30).map("".join)
IDS = st.from_regex(re.compile(r"[A-Za-z0-9_.~-]{1,40}"), fullmatch=True)
EVENT_NAMES = st.one_of(st.none(), st.sampled_from(["error", "message", "response.created"]))


def spec_data(text: str) -> str:
    """What a conforming client must see as `data` for `text`."""
    return re.sub(r"\r\n|\r", "\n", text).replace("\0", "\ufffd")


def sdk_events(raw: bytes) -> list[tuple[str | None, str, str | None]]:
    return [(e.event, e.data, e.id) for e in SSEDecoder().iter_bytes(iter([raw]))]


def stream_of(items: list[tuple[str, str, str | None, bool]]) -> bytes:
    out = b""
    for text, eid, name, heartbeat in items:
        if heartbeat:
            out += sse.encode_comment("keep-alive")
        out += sse.encode_event(text, id=eid, event=name)
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(TEXT, IDS, EVENT_NAMES, st.booleans()), min_size=1, max_size=6))
def test_every_event_decodes_to_itself_with_heartbeats_between(
    items: list[tuple[str, str, str | None, bool]],
) -> None:
    raw = stream_of(items)
    want = [(name, spec_data(text), eid) for text, eid, name, _ in items]
    spec = [(e.get("event"), e["data"], e.get("id")) for e in parse_events(raw) if "data" in e]
    assert spec == want
    # The SDK reports the default event type as None and keeps the last id: the same here
    # because every event of ours sets its own id. Heartbeats dispatch nothing.
    assert sdk_events(raw) == want


@settings(max_examples=300, deadline=None)
@given(TEXT, IDS, EVENT_NAMES)
def test_the_json_fast_path_equals_the_general_encoder(
    text: str, eid: str, name: str | None
) -> None:
    payload = orjson.dumps({"choices": [{"delta": {"content": text}}]})
    fast = sse.encode_data(payload, id=eid.encode(), event=name.encode() if name else None)
    assert fast == sse.encode_event(payload.decode(), id=eid, event=name)
    ((event, data, got_id),) = sdk_events(fast)
    assert (event, got_id) == (name, eid)
    assert orjson.loads(data)["choices"][0]["delta"]["content"] == text


@settings(max_examples=200, deadline=None)
@given(TEXT)
def test_a_comment_never_dispatches_an_event(text: str) -> None:
    raw = sse.encode_comment(text) + sse.encode_comment(text)
    assert [e for e in parse_events(raw) if "data" in e] == []
    assert sdk_events(raw) == []
