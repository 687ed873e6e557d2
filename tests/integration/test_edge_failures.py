"""Failures through a real edge and worker: validation, overload, a worker dying mid-stream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.integration.edge_fixtures import (
    Stack,
    data_events,
    dechunk,
    parse_sse,
    raw_request,
    read_to_end,
    read_until,
    stack,
    worker_stats,
)
from tests.waits import eventually

MESSAGES = [{"role": "user", "content": "Say something."}]
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def sim() -> Iterator[Stack]:
    with stack(("--sim-ttft", "0.01", "--sim-token-delay", "0.001")) as s:
        yield s


def body(**over: Any) -> dict[str, Any]:
    return {"model": "", "messages": MESSAGES, "max_tokens": 8, **over}


# Refused by the edge itself, and (last ones) by the worker, mapped back to OpenAI names.
CASES = [
    ({"model": ""}, "messages"),
    (body(messages=[{"role": "robot", "content": "x"}]), "messages[0].role"),
    (body(temperature=3), "temperature"),
    (body(top_p=0), "top_p"),
    (body(max_tokens=0), "max_tokens"),
    (body(n=17), "n"),
    (
        body(
            response_format={
                "type": "json_schema",
                "json_schema": {"schema": {"$ref": "#/nowhere"}},
            }
        ),
        "response_format.json_schema",
    ),
    (
        body(
            response_format={"type": "json_schema", "json_schema": {"schema": {"type": "object"}}},
            tools=[{"type": "function", "function": {"name": "f"}}],
            tool_choice="required",
        ),
        "response_format",
    ),
    (body(tools=[{"type": "function", "function": {"name": "f"}}]), "tool_choice"),
    (body(structured_outputs={"regex": "[a-z]+"}), "response_format.regex"),
    (body(stop=["a", ""]), "stop"),
    (body(presence_penalty=-9), "presence_penalty"),
    (body(top_logprobs=2), "top_logprobs"),
    (body(stream_options={"include_usage": True}), "stream_options"),
    (body(stream=1), "stream"),
    (body(max_tokens=100_000), "max_tokens"),  # the worker: over the context window
    (body(max_tokens=100_000, stream=True), "max_tokens"),  # ... also before a stream's 200
    (body(messages=[{"role": "user", "content": ""}]), "messages"),  # the worker: all empty
]


@pytest.mark.parametrize(("payload", "param"), CASES)
def test_validation_is_a_400_naming_the_param(
    sim: Stack, payload: dict[str, Any], param: str
) -> None:
    resp = httpx.post(f"{sim.base}{CHAT}", json=payload, timeout=10)
    assert resp.status_code == 400, resp.text
    assert resp.headers["content-type"] == "application/json"
    err = resp.json()["error"]
    assert err["param"] == param
    assert err["type"] == "invalid_request_error"
    assert err["message"]


def test_invalid_json_is_a_400(sim: Stack) -> None:
    resp = httpx.post(
        f"{sim.base}{CHAT}", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] is None


def test_unknown_model_is_a_404(sim: Stack) -> None:
    resp = httpx.post(f"{sim.base}{CHAT}", json=body(model="no-such-model"), timeout=10)
    assert resp.status_code == 404
    err = resp.json()["error"]
    assert err["param"] == "model" and err["code"] == "model_not_found"


def test_openai_client_sees_bad_request(sim: Stack) -> None:
    client = openai.OpenAI(base_url=f"{sim.base}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="", messages=MESSAGES, top_p=0)  # type: ignore[arg-type]
    assert info.value.param == "top_p"


@pytest.fixture(scope="module")
def tiny() -> Iterator[Stack]:
    """One batch slot, no waiting room, slow tokens: the second request is refused."""
    args = ("--max-num-seqs", "1", "--max-waiting", "0", "--sim-token-delay", "0.02")
    with stack(args) as s:
        yield s


def test_overload_is_a_429_with_retry_after(tiny: Stack) -> None:
    long = body(max_tokens=400, ignore_eos=True, min_tokens=400, stream=True)
    host, port = tiny.edge.address.split(":")
    holder = raw_request((host, int(port)), CHAT, long)
    try:
        read_until(holder, b"data:")  # the one slot is taken
        assert worker_stats(tiny.worker.address).running == 1
        for stream in (False, True):
            resp = httpx.post(f"{tiny.base}{CHAT}", json=body(stream=stream), timeout=10)
            assert resp.status_code == 429, resp.text
            assert int(resp.headers["retry-after"]) >= 1
            assert int(resp.headers["retry-after-ms"]) > 0
            err = resp.json()["error"]
            assert err["type"] == "rate_limit_error" and err["code"] == "overloaded"
        client = openai.OpenAI(base_url=f"{tiny.base}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model="", messages=MESSAGES)  # type: ignore[arg-type]
    finally:
        holder.close()


def test_worker_killed_mid_stream_ends_with_error_event() -> None:
    with stack(("--sim-token-delay", "0.01")) as s:
        host, port = s.edge.address.split(":")
        sock = raw_request(
            (host, int(port)), CHAT, body(max_tokens=500, min_tokens=500, stream=True)
        )
        try:
            head = read_until(sock, b"data: {", count=4)  # role chunk + 3 deltas
            assert b" 200 " in head.split(b"\r\n", 1)[0]
            s.worker.kill()
            raw = head + read_to_end(sock)
        finally:
            sock.close()
        events = data_events(parse_sse(dechunk(raw)))
        assert events[-1].get("event") == "error", events[-2:]
        err = orjson.loads(events[-1]["data"])["error"]
        assert err["code"] == "unavailable" and err["retryable"] is True
        assert "127.0.0.1" not in err["message"]  # no internal addresses
        assert all(e["data"] != "[DONE]" for e in events)
        assert len(events) > 4  # it did stream before the worker died
        # The edge itself stays up; it is no longer ready.
        assert httpx.get(f"{s.base}/healthz").status_code == 200
        eventually(
            lambda: httpx.get(f"{s.base}/readyz").status_code == 503,
            what="the edge not ready with its only worker dead",
            timeout=5,
        )
        resp = httpx.post(f"{s.base}{CHAT}", json=body(), timeout=10)
        assert resp.status_code == 503 and "retry-after" in resp.headers
        assert s.edge.proc.poll() is None


def test_oversized_body_is_a_413(sim: Stack) -> None:
    huge = body(messages=[{"role": "user", "content": "x" * (4 * 1024 * 1024)}])
    resp = httpx.post(f"{sim.base}{CHAT}", json=huge, timeout=10)
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "request_too_large"


def test_client_request_id_is_echoed(sim: Stack) -> None:
    resp = httpx.post(f"{sim.base}{CHAT}", json=body(), headers={"x-request-id": "trace-42"})
    assert resp.status_code == 200 and resp.headers["x-request-id"] == "trace-42"
    odd = httpx.post(f"{sim.base}{CHAT}", json=body(), headers={"x-request-id": "bad id\t!"})
    assert odd.headers["x-request-id"] != "bad id\t!"  # not a usable token: ours instead
    assert odd.json()["id"] == "chatcmpl-" + odd.headers["x-request-id"]
