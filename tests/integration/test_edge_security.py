"""The edge's security and limits against real processes: a sim worker (JSON logs) and a
real uvicorn edge with API keys (file and environment), an admin key, per-key limits,
CORS, JSON access logs and stamp forwarding. Each test uses its own key, so the per-key
limits of one test do not touch another.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from starlette.routing import Mount, Route, WebSocketRoute

from edge.api.routes import GENERATION_ROUTES, READ, STREAM_LINK, Dispatch
from edge.app import create_app
from edge.config import EdgeConfig, RoutingConfig
from scripts.bench.openai_driver import StreamSink
from scripts.bench.record import RequestRecord
from scripts.bench.sse_reader import ResponseParser
from tests.integration.edge_fixtures import (
    EDGE_ENV,
    chat_text,
    chunks,
    data_events,
    parse_sse,
    read_until,
    wait_ready,
)
from tests.procs import Proc, start_edge, start_worker
from tests.waits import eventually

ORIGIN = "https://app.example.com"
MAX_PROMPT = 1000
MAX_BODY = 4000
RATE, BURST, STREAMS = 5, 20, 2
KEYS = {
    name: f"sk-test-{name}-{secrets.token_hex(12)}"
    for name in ("alice", "bob", "plain", "rate", "conc", "walker", "cors", "metrics", "env")
}
ADMIN_KEY = "admin-" + secrets.token_hex(16)
# What a request may do without any key: the chat page, probes, stream links (capabilities).
PUBLIC = {
    (method, path)
    for path in ("/", "/health", "/healthz", "/readyz", "/v1/streams/{token}")
    for method in ("GET", "HEAD")
}


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def auth(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[name]}"}


def body(max_tokens: int = 4, content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **extra}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, Proc, str]]:
    keys_file: Path = tmp_path_factory.mktemp("keys") / "api-keys"
    lines = ["# every form of key line", f"bob:{KEYS['bob']}", KEYS["plain"]]
    lines += [f"{n}:sha256:{sha(KEYS[n])}" for n in KEYS if n not in ("bob", "plain", "env")]
    keys_file.write_text("\n".join(lines) + "\n")
    env = {
        **EDGE_ENV,
        "SLUICE_API_KEYS": f"env:sha256:{sha(KEYS['env'])}, ",
        "SLUICE_ADMIN_KEY": ADMIN_KEY,
    }
    worker = start_worker("--engine", "sim", "--sim-token-delay", "0.01", "--log-format", "json")
    try:
        edge = start_edge(
            "--worker", worker.address, "--api-keys-file", str(keys_file),
            "--rate-limit", str(RATE), "--rate-burst", str(BURST),
            "--max-streams-per-key", str(STREAMS), "--max-prompt-chars", str(MAX_PROMPT),
            "--max-body-bytes", str(MAX_BODY), "--cors-origin", ORIGIN,
            "--cors-origin", "http://localhost:5173", "--log-format", "json", "--allow-stamps",
            env=env,
        )  # fmt: skip
        try:
            base = f"http://{edge.address}"
            wait_ready(base)
            yield worker, edge, base
        finally:
            edge.kill()
    finally:
        worker.kill()


# -- keys ------------------------------------------------------------------------------


def _routes(routes: list[Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    for r in routes:
        if isinstance(r, Mount):
            if r.routes:
                yield from _routes(list(r.routes), prefix + r.path)
            else:
                yield "GET", prefix + r.path + "/x"
        elif isinstance(r, Route):
            for method in sorted(r.methods or {"GET"}):
                yield method, prefix + r.path
        elif isinstance(r, WebSocketRoute):
            yield "GET", prefix + r.path
        else:
            raise AssertionError(f"teach this test about {r!r}")


def app_routes() -> list[tuple[str, str]]:
    """Every (method, path template) the edge serves, as built now (its generation routes
    and its Starlette app's, admin included): routes added by anyone later are walked too."""
    config = EdgeConfig(routing=RoutingConfig(workers=["127.0.0.1:9"], admin_key="k" * 16))
    app: Any = create_app(config)
    while not isinstance(app, Dispatch):
        app = app.app
    generation = [(m, path) for path, (methods, _) in GENERATION_ROUTES.items() for m in methods]
    link = [(m, STREAM_LINK + "{token}") for m in READ]
    return sorted({*generation, *link, *_routes(list(app.rest.routes))})


def test_every_route_needs_a_key_except_the_public_ones(stack):
    _, _, base = stack
    routes = app_routes()
    assert {("POST", "/v1/chat/completions"), ("GET", "/metrics")} <= set(routes)
    assert PUBLIC <= set(routes), "the allowlist names routes that do not exist"
    with httpx.Client(base_url=base, timeout=10) as c:
        for method, template in [*routes, ("GET", "/no/such/path"), ("POST", "/v1/nope")]:
            path = re.sub(r"\{[^}]+\}", "x", template)
            kw: dict[str, Any] = {"json": {}} if method in ("POST", "PUT", "PATCH") else {}
            r = c.request(method, path, **kw)
            if (method, template) in PUBLIC:
                assert r.status_code != 401, (method, template)
                continue
            assert r.status_code == 401, (method, template, r.status_code, r.text)
            assert r.headers["www-authenticate"].startswith("Bearer")
            if method != "HEAD" and path.startswith("/v1/messages"):  # Anthropic's API
                message = r.json()["error"]["message"]
                assert "API key" in message and r.json() == {
                    "type": "error",
                    "error": {"type": "authentication_error", "message": message},
                }
            elif method != "HEAD":
                assert r.json()["error"] == {
                    "message": r.json()["error"]["message"],
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            wrong = c.request(method, path, headers={"authorization": "Bearer sk-wrong-key"}, **kw)
            assert wrong.status_code in (401, 403), (method, template)
            # With a valid API key the API answers; admin routes still refuse it.
            admin = template == "/metrics" or template.startswith("/admin")
            r = c.request(method, path, headers=auth("walker"), **kw)
            assert (r.status_code == 403) if admin else (r.status_code != 401), (method, template)
        assert c.get("/").status_code == 200 and c.get("/healthz").status_code == 200


def test_keys_from_every_source_work_and_the_admin_key_is_separate(stack):
    _, _, base = stack
    with httpx.Client(base_url=base, timeout=10) as c:
        for name in ("alice", "bob", "plain", "env"):  # hashed, named, bare, environment
            assert c.get("/v1/models", headers=auth(name)).status_code == 200, name
        assert (
            c.get("/v1/models", headers={"authorization": "Basic " + KEYS["alice"]}).status_code
            == 401
        )
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        assert c.get("/v1/models", headers=admin).status_code == 401  # not an API key
        assert c.get("/metrics", headers=auth("alice")).status_code == 403
        assert c.get("/metrics", headers=admin).status_code == 200


def test_stream_links_are_capabilities_but_creating_one_needs_a_key(stack):
    _, _, base = stack
    with httpx.Client(base_url=base, timeout=30) as c:
        assert c.post("/v1/streams", json=body()).status_code == 401
        made = c.post("/v1/streams", json=body(5), headers=auth("alice"))
        assert made.status_code == 201, made.text
        page = c.get("/")  # the chat page sends its key input as Authorization
        assert "authorization" in page.text and 'id="key"' in page.text
        r = c.get(made.json()["stream_url"])  # no key: EventSource cannot send one
        assert r.status_code == 200
        assert chat_text(chunks(parse_sse(r.content)))


# -- limits ----------------------------------------------------------------------------


def test_rate_limit_per_key_answers_429_with_retry_after(stack):
    _, _, base = stack
    with httpx.Client(base_url=base, timeout=10) as c:
        before = scrape(c)
        t0 = time.monotonic()
        codes = [c.get("/v1/models", headers=auth("rate")) for _ in range(BURST + 15)]
        elapsed = time.monotonic() - t0
        refused = [r for r in codes if r.status_code == 429]
        assert codes[0].status_code == 200 and refused
        assert len(codes) - len(refused) <= BURST + RATE * elapsed + 1
        rejections = 'sluice_edge_admission_rejections_total{reason="rate_limit"}'
        assert scrape(c)[rejections] - before.get(rejections, 0) == len(refused)
        r = refused[0]
        assert r.headers["retry-after"] == "1"
        assert 0 < int(r.headers["retry-after-ms"]) <= 1000 / RATE
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert r.json()["error"]["type"] == "rate_limit_error"
        assert c.get("/v1/models", headers=auth("bob")).status_code == 200  # others unaffected
        # A client waiting as told: the hint is what is under test, not a wait for an event.
        time.sleep(int(r.headers["retry-after-ms"]) / 1000 + 0.05)
        assert c.get("/v1/models", headers=auth("rate")).status_code == 200


def open_stream(address: str, key: str, max_tokens: int) -> socket.socket:
    """A streaming chat request on a raw socket, read up to its first token event."""
    host, port = address.split(":")
    sock = socket.create_connection((host, int(port)))
    payload = orjson.dumps(body(max_tokens, stream=True))
    sock.sendall(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {address}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    head = read_until(sock, b'"content":"', count=2)
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    return sock


def test_concurrent_streams_per_key_are_released_at_the_end_and_on_disconnect(stack):
    _, edge, base = stack
    one, two = (open_stream(edge.address, KEYS["conc"], 2000) for _ in range(2))
    with httpx.Client(base_url=base, timeout=30) as c:
        try:
            r = c.post("/v1/chat/completions", json=body(1), headers=auth("conc"))
            assert r.status_code == 429, r.text
            assert r.json()["error"]["code"] == "concurrency_limit_exceeded"
            assert r.headers["retry-after"] == "1"
            rejected = scrape(c)['sluice_edge_admission_rejections_total{reason="concurrency"}']
            assert rejected >= 1
            assert c.post("/v1/chat/completions", json=body(1), headers=auth("bob")).is_success
            one.close()  # the client goes away: its slot is free at once

            def admitted() -> httpx.Response | None:
                r = c.post("/v1/chat/completions", json=body(1), headers=auth("conc"))
                return None if r.status_code == 429 else r

            r = eventually(
                admitted, what="the slot released after a disconnect", timeout=3, interval=0.2
            )
            assert r.status_code == 200
            # Streams that run to their end release their slot too: with `two` still
            # open, one slot is left; two streams in a row both fit only if the first
            # gave it back.
            for _ in range(2):
                s = c.post("/v1/chat/completions", json=body(3, stream=True), headers=auth("conc"))
                assert s.status_code == 200 and chunks(parse_sse(s.content))
        finally:
            one.close()
            two.close()


def test_body_and_prompt_limits(stack):
    _, _, base = stack
    h = auth("alice")
    with httpx.Client(base_url=base, timeout=30) as c:
        big = {"messages": [{"role": "user", "content": "x" * MAX_BODY}]}
        r = c.post("/v1/chat/completions", json=big, headers=h)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        raw = orjson.dumps(big)
        chunked = c.post(  # no Content-Length: the limit applies while reading
            "/v1/chat/completions",
            content=iter([raw[:1000], raw[1000:]]),
            headers={**h, "content-type": "application/json"},
        )
        assert chunked.status_code == 413
        two = [{"role": "system", "content": "s" * 600}, {"role": "user", "content": "u" * 401}]
        for path, req, param in (
            ("/v1/chat/completions", {"messages": two}, "messages"),
            ("/v1/streams", {"messages": two}, "messages"),
            ("/v1/completions", {"prompt": "p" * (MAX_PROMPT + 1)}, "prompt"),
        ):
            r = c.post(path, json=req, headers=h)
            assert r.status_code == 400, (path, r.text)
            assert r.json()["error"]["param"] == param
            assert r.json()["error"]["code"] == "prompt_too_long"
        ok = c.post(
            "/v1/completions", json={"prompt": "p" * MAX_PROMPT, "max_tokens": 2}, headers=h
        )
        assert ok.status_code == 200, ok.text


# -- CORS ------------------------------------------------------------------------------


def test_cors_preflight_and_responses(stack):
    _, _, base = stack
    with httpx.Client(base_url=base, timeout=30) as c:
        pre = c.options(
            "/v1/chat/completions",
            headers={
                "origin": ORIGIN,
                "access-control-request-method": "POST",
                "access-control-request-headers": "authorization, content-type",
            },
        )
        assert pre.status_code == 200, pre.text
        assert pre.headers["access-control-allow-origin"] == ORIGIN
        assert "POST" in pre.headers["access-control-allow-methods"]
        allowed = pre.headers["access-control-allow-headers"].lower()
        assert "authorization" in allowed and "content-type" in allowed
        assert "access-control-allow-credentials" not in pre.headers
        evil = c.options(
            "/v1/chat/completions",
            headers={"origin": "https://evil.example", "access-control-request-method": "POST"},
        )
        assert evil.status_code == 400
        assert "access-control-allow-origin" not in evil.headers
        # Real requests: the stream and a refusal both let the page read them.
        r = c.post(
            "/v1/chat/completions",
            json=body(3, stream=True),
            headers={**auth("cors"), "origin": ORIGIN},
        )
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
        assert "x-request-id" in r.headers["access-control-expose-headers"].lower()
        denied = c.post("/v1/chat/completions", json=body(), headers={"origin": ORIGIN})
        assert denied.status_code == 401
        assert denied.headers["access-control-allow-origin"] == ORIGIN
        other = c.post(
            "/v1/chat/completions", json=body(), headers={"origin": "https://evil.example"}
        )
        assert "access-control-allow-origin" not in other.headers


# -- metrics ---------------------------------------------------------------------------


def scrape(c: httpx.Client) -> dict[str, float]:
    r = c.get("/metrics", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert r.status_code == 200
    out = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def token_events(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for e in data_events(parse_sse(raw)):
        if e["data"].startswith("{"):
            chunk = json.loads(e["data"])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                out.append({**e, "chunk": chunk})
    return out


def test_metrics_follow_streams_resumes_refusals(stack):
    _, _, base = stack
    h = auth("metrics")
    ttft = 'sluice_edge_time_to_first_token_seconds_count{route="/v1/chat/completions"}'
    with httpx.Client(base_url=base, timeout=30) as c:
        before = scrape(c)
        r = c.post("/v1/chat/completions", json=body(8, stream=True), headers=h)
        events = token_events(r.content)
        made = c.post("/v1/streams", json=body(3), headers=h).json()
        assert c.get(made["stream_url"]).status_code == 200
        resumed = c.post(
            "/v1/chat/completions",
            json=body(8, stream=True),
            headers={**h, "last-event-id": events[2]["id"]},
        )
        assert resumed.status_code == 200
        c.get("/v1/models")  # no key
        c.get("/v1/models", headers={"authorization": "Bearer not-a-key-of-ours"})
        after = scrape(c)

    def delta(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    n = len(events)
    assert n >= 2
    assert delta(ttft) == 1  # new streams only: the resume and the link do not count
    assert delta("sluice_edge_inter_token_latency_seconds_count") >= n - 1
    assert delta("sluice_edge_write_overhead_seconds_count") >= n
    assert (
        after['sluice_edge_write_overhead_seconds_bucket{le="+Inf"}']
        == after["sluice_edge_write_overhead_seconds_count"]
    )
    assert delta('sluice_edge_resumes_total{via="stream_link"}') == 1
    assert delta('sluice_edge_resumes_total{via="last_event_id"}') == 1
    assert delta('sluice_edge_requests_total{route="/v1/streams/{token}",status="200"}') == 1
    assert delta('sluice_edge_requests_total{route="/v1/models",status="401"}') == 2
    assert delta('sluice_edge_auth_failures_total{reason="missing"}') == 1
    assert delta('sluice_edge_auth_failures_total{reason="invalid"}') == 1
    assert after["sluice_edge_streams_in_flight"] == 0
    assert not any("{token}" not in k and "/v1/streams/" in k for k in after)  # no capability


# -- logs and stamps -------------------------------------------------------------------


def json_records(proc: Proc) -> list[dict[str, Any]]:
    return [json.loads(line) for line in proc.log().splitlines() if line.startswith("{")]


def wait_for(pred: Any, proc: Proc, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The log records `pred` picks, once there are any."""
    return eventually(
        lambda: [r for r in json_records(proc) if pred(r)],
        what="a matching log record",
        timeout=timeout,
        detail=lambda: proc.log()[-2000:],
    )


def test_json_access_log_and_the_worker_log_share_the_trace_id(stack):
    worker, edge, base = stack
    trace = "trace-" + secrets.token_hex(6)
    with httpx.Client(base_url=base, timeout=30) as c:
        r = c.post(
            "/v1/chat/completions",
            json=body(6),
            headers={**auth("alice"), "x-request-id": trace},
        )
        assert r.status_code == 200
        c.get("/v1/models", headers={"x-request-id": trace + "-denied"})
    (rec,) = wait_for(
        lambda r: r.get("logger") == "sluice.edge.access" and r.get("trace_id") == trace, edge
    )
    assert rec["route"] == "/v1/chat/completions" and rec["status"] == 200
    assert rec["key"] == "alice" and rec["completion_tokens"] == 6 and rec["duration_ms"] > 0
    assert rec["request_id"] == r.json()["id"].removeprefix("chatcmpl-")
    work = wait_for(lambda r: r.get("trace_id") == trace, worker)
    assert {w["request_id"] for w in work} == {rec["request_id"]}
    (denied,) = wait_for(lambda r: r.get("trace_id") == trace + "-denied", edge)
    assert denied["status"] == 401 and denied["key"] is None
    assert not any(KEYS["alice"] in line for line in edge.log().splitlines())


def raw_stream(address: str, headers: dict[str, str]) -> bytes:
    host, port = address.split(":")
    with socket.create_connection((host, int(port))) as sock:
        payload = orjson.dumps(body(12, stream=True))
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        sock.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {address}\r\n{extra}"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + payload
        )
        sock.settimeout(30)
        out = b""
        while part := sock.recv(65536):
            out += part
    return out


def test_worker_stamps_reach_chunks_only_when_asked(stack):
    _, edge, _ = stack
    t0 = time.time_ns()
    raw = raw_stream(edge.address, {**auth("bob"), "X-Sluice-Stamp-Times": "1"})
    t1 = time.time_ns()
    # Read by the benchmark harness's own parser, as scripts/bench does.
    rec = RequestRecord()
    parser = ResponseParser(StreamSink(rec, "chat", stamp=True))
    parser.feed(raw, time.perf_counter_ns())
    assert parser.done and rec.stamp_lat_ns and len(rec.stamp_lat_ns) == len(rec.event_ns)
    body_bytes = raw.split(b"\r\n\r\n", 1)[1]
    stamps = [int(x) for x in re.findall(rb'"sluice_worker_time_ns":(\d+)', body_bytes)]
    assert len(stamps) == len(rec.event_ns) and stamps == sorted(stamps)
    assert all(t0 <= s <= t1 for s in stamps)
    plain = raw_stream(edge.address, auth("bob"))
    assert b'"content":"' in plain and b"sluice_worker_time_ns" not in plain
