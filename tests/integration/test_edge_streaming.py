"""The edge streams what the worker generates, in the OpenAI wire format.

Every expected text comes from a direct gRPC Generate to the same worker with the same
greedy request, never from a string written here.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from edge.stream.ids import PART_DONE
from tests.integration.edge_fixtures import (
    CODEC,
    Stack,
    chat_start,
    chat_text,
    chunks,
    data_events,
    direct_generate,
    list_models,
    metric,
    parse_sse,
    stack,
    stream_raw,
)

MESSAGES = [
    {"role": "system", "content": "Be terse."},
    {"role": "user", "content": "Name a river."},
]
FINISH = {1: "stop", 2: "length"}


@pytest.fixture(scope="module")
def sim() -> Iterator[Stack]:
    with stack(
        ("--sim-ttft", "0.02", "--sim-token-delay", "0.002", "--sim-answer-tokens", "24")
    ) as s:
        yield s


def chat_body(**over: Any) -> dict[str, Any]:
    return {"model": "", "messages": MESSAGES, "temperature": 0, "max_tokens": 40, **over}


def reference(sim: Stack, **sampling: Any) -> tuple[str, Any]:
    return direct_generate(sim.worker.address, chat_start(MESSAGES, temperature=0, **sampling))


def test_chat_stream_text_equals_worker_text(sim: Stack) -> None:
    want, final = reference(sim, max_tokens=40)
    resp, raw = stream_raw(sim.base, "/v1/chat/completions", chat_body(stream=True))
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.headers["cache-control"] == "no-cache"
    assert resp.headers["x-accel-buffering"] == "no"
    got = chunks(parse_sse(raw))
    assert got[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in got)
    assert len({c["id"] for c in got}) == 1
    assert want and chat_text(got) == want
    assert [c["choices"][0]["finish_reason"] for c in got[:-1]] == [None] * (len(got) - 1)
    assert got[-1]["choices"][0]["finish_reason"] == FINISH[final.reason]
    assert "usage" not in got[-1]


def _same_request(events: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Events with what differs between two runs of one request taken out (ids, time)."""
    out: list[dict[str, Any]] = []
    for e in events:
        data = e.get("data")
        body = orjson.loads(data) if data and data.startswith("{") else data
        if isinstance(body, dict):
            body.pop("id"), body.pop("created")
        out.append({**e, "id": "id" in e, "data": body})
    return _text_joined(out)


def _text_joined(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs of text-only deltas as one: how many tokens an event carries depends on how
    far the writer is behind when they arrive (the edge joins what is waiting). Only
    events equal but for their text join; any other field differing starts a new one."""
    out: list[dict[str, Any]] = []
    run: Any = None  # the joined run's event without its text
    for e in events:
        body = e["data"]
        choice = body["choices"][0] if isinstance(body, dict) and body.get("choices") else None
        if choice is None or choice.get("finish_reason") is not None:
            out.append(e)
            run = None
            continue
        delta = choice.get("delta", {})
        if set(delta) != {"content"}:
            out.append(e)
            run = None
            continue
        bare = orjson.loads(orjson.dumps(e))
        del bare["data"]["choices"][0]["delta"]["content"]
        if run is not None and bare == run:
            out[-1]["data"]["choices"][0]["delta"]["content"] += delta["content"]
            continue
        out.append(orjson.loads(orjson.dumps(e)))
        run = bare
    return out


def test_a_client_accepting_gzip_gets_the_same_stream_gzipped(sim: Stack) -> None:
    plain_resp, plain = stream_raw(
        sim.base,
        "/v1/chat/completions",
        chat_body(stream=True),
        headers={"accept-encoding": "identity"},
    )
    assert "content-encoding" not in plain_resp.headers
    inflate, decoded, wire = zlib.decompressobj(16 + zlib.MAX_WBITS), [], 0
    with httpx.stream(
        "POST",
        f"{sim.base}/v1/chat/completions",
        json=chat_body(stream=True),
        headers={"accept-encoding": "gzip, deflate"},
        timeout=60,
    ) as resp:
        assert (resp.headers["content-encoding"], resp.headers["vary"]) == (
            "gzip",
            "accept-encoding",
        )
        for part in resp.iter_raw():
            wire += len(part)
            decoded.append(inflate.decompress(part))
    assert inflate.eof
    assert _same_request(parse_sse(b"".join(decoded))) == _same_request(parse_sse(plain))
    assert len(chunks(parse_sse(plain))) > 20 and wire < len(plain) / 4


def test_completion_stream_text_equals_worker_text(sim: Stack) -> None:
    start = chat_start([], temperature=0, max_tokens=12)
    start.prompt = "The river flows"
    want, final = direct_generate(sim.worker.address, start)
    body = {"prompt": "The river flows", "temperature": 0, "max_tokens": 12, "stream": True}
    resp, raw = stream_raw(sim.base, "/v1/completions", body)
    got = chunks(parse_sse(raw))
    assert resp.status_code == 200
    assert "".join(c["choices"][0]["text"] for c in got) == want
    assert got[-1]["choices"][0]["finish_reason"] == FINISH[final.reason] == "length"


def test_event_ids_are_gapless_unique_and_on_every_event(sim: Stack) -> None:
    _, raw = stream_raw(sim.base, "/v1/chat/completions", chat_body(stream=True))
    events = data_events(parse_sse(raw))
    assert "retry" in events[0] and int(events[0]["retry"]) > 0
    assert all("id" in e for e in events)
    decoded = [CODEC.parse(e["id"]) for e in events]  # signed with the edge's secret
    assert len({e["id"] for e in events}) == len(events)
    assert len({(p.request_id, p.worker) for p in decoded}) == 1
    assert [p.seq for p in decoded] == list(range(len(events)))
    cursors = [p.cursor for p in decoded]
    assert cursors == sorted(cursors) and cursors[-1] > 0
    assert [p.part for p in decoded[-2:]] == [1, PART_DONE]  # finish, [DONE]


def test_usage_chunk_when_asked_matches_worker(sim: Stack) -> None:
    _, final = reference(sim, max_tokens=40)
    body = chat_body(stream=True, stream_options={"include_usage": True})
    _, raw = stream_raw(sim.base, "/v1/chat/completions", body)
    got = chunks(parse_sse(raw))
    last = got[-1]
    assert last["choices"] == []
    assert last["usage"] == {
        "prompt_tokens": final.usage.prompt_tokens,
        "completion_tokens": final.usage.completion_tokens,
        "total_tokens": final.usage.prompt_tokens + final.usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": final.usage.cached_prompt_tokens},
    }
    assert all(c["usage"] is None for c in got[:-1])


def test_non_streaming_matches_worker(sim: Stack) -> None:
    want, final = reference(sim, max_tokens=40)
    resp = httpx.post(f"{sim.base}/v1/chat/completions", json=chat_body(), timeout=30)
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": want}
    assert body["choices"][0]["finish_reason"] == FINISH[final.reason]
    assert body["usage"]["completion_tokens"] == final.usage.completion_tokens


def test_stop_strings_reach_the_worker(sim: Stack) -> None:
    full, _ = reference(sim, max_tokens=40)
    words = full.split(" ")
    stop = " " + words[4]  # a word from the middle of the greedy answer
    want, final = reference(sim, max_tokens=40, stop=[stop])
    _, raw = stream_raw(sim.base, "/v1/chat/completions", chat_body(stream=True, stop=stop))
    got = chunks(parse_sse(raw))
    assert chat_text(got) == want and len(want) < len(full)
    assert got[-1]["choices"][0]["finish_reason"] == "stop" == FINISH[final.reason]


def test_openai_client_streaming_and_not(sim: Stack) -> None:
    want, _ = reference(sim, max_tokens=40)
    client = openai.OpenAI(base_url=f"{sim.base}/v1", api_key="unused", max_retries=0)
    model = list_models(sim.worker.address)[0]
    stream = client.chat.completions.create(
        model=model,
        messages=MESSAGES,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, usage = [], None
    for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(parts) == want
    assert usage is not None and usage.completion_tokens > 0
    whole = client.chat.completions.create(
        model=model,
        messages=MESSAGES,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=40,
    )
    assert whole.choices[0].message.content == want
    assert whole.model == model
    listed = [m.id for m in client.models.list()]
    assert listed == [model]


def test_openai_client_completions(sim: Stack) -> None:
    start = chat_start([], temperature=0, max_tokens=10)
    start.prompt = "Once"
    want, _ = direct_generate(sim.worker.address, start)
    client = openai.OpenAI(base_url=f"{sim.base}/v1", api_key="unused", max_retries=0)
    whole = client.completions.create(model="", prompt="Once", temperature=0, max_tokens=10)
    assert whole.choices[0].text == want
    streamed = client.completions.create(
        model="", prompt="Once", temperature=0, max_tokens=10, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == want


def test_models_come_from_the_worker(sim: Stack) -> None:
    resp = httpx.get(f"{sim.base}/v1/models", timeout=5)
    assert resp.status_code == 200
    assert [m["id"] for m in resp.json()["data"]] == list_models(sim.worker.address)


def test_health_endpoints_and_metrics(sim: Stack) -> None:
    assert httpx.get(f"{sim.base}/healthz").status_code == 200
    assert httpx.get(f"{sim.base}/readyz").json()["ready"] is True
    label = '{route="/v1/chat/completions",status="200"}'
    before = metric(sim.base, "sluice_edge_requests_total", label)
    stream_raw(sim.base, "/v1/chat/completions", chat_body(stream=True))
    assert metric(sim.base, "sluice_edge_requests_total", label) == before + 1
    assert metric(sim.base, "sluice_edge_workers_serving") == 1
    text = httpx.get(f"{sim.base}/metrics").text
    assert "# TYPE sluice_edge_streams_in_flight gauge" in text


def test_unknown_route_is_an_openai_error(sim: Stack) -> None:
    resp = httpx.get(f"{sim.base}/v1/nothing-here")
    assert resp.status_code == 404
    assert set(resp.json()["error"]) == {"message", "type", "param", "code"}


def test_deadline_from_the_client_header(sim: Stack) -> None:
    # ~2000 tokens at 2 ms each: far longer than the 0.3 s the client allows.
    long = chat_body(max_tokens=2000, ignore_eos=True, min_tokens=2000)
    resp = httpx.post(
        f"{sim.base}/v1/chat/completions",
        json=long,
        headers={"x-request-timeout": "0.3"},
        timeout=30,
    )
    assert resp.status_code == 504
    assert resp.json()["error"]["code"] == "deadline_exceeded"
    # Streaming: the 200 went out first, so the deadline is the stream's final error event.
    _, raw = stream_raw(
        sim.base,
        "/v1/chat/completions",
        {**long, "stream": True},
        headers={"x-request-timeout": "0.5"},
    )
    events = data_events(parse_sse(raw))
    assert events[-1].get("event") == "error"
    err = orjson.loads(events[-1]["data"])["error"]
    assert err["code"] == "deadline_exceeded" and err["retryable"] is False
    assert all(e["data"] != "[DONE]" for e in events)
