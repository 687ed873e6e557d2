"""Regression tests for the defects found by trying the stack as a hostile client and an
unlucky operator would (issue 12). Each test is named after its defect.

Real processes only: a sim worker (or two), a real uvicorn edge, the official `openai`
SDK, raw sockets for misbehaving clients.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import orjson
import pytest

from edge.upstream.worker import worker_key
from tests.integration.edge_fixtures import (
    EDGE_ENV,
    Stack,
    chat_start,
    direct_generate,
    metric,
    parse_sse,
    stack,
    wait_ready,
)
from tests.procs import start_edge, start_worker
from tests.waits import eventually

MESSAGES = [{"role": "user", "content": "Tell me about rivers and the sea."}]


# -- 1: heartbeats must be invisible to the openai SDK's SSE decoder ---------------------


@pytest.fixture(scope="module")
def slow_prefill() -> Iterator[Stack]:
    # A 0.8 s prefill under a 0.1 s heartbeat: several heartbeats before the first token,
    # between events that carry an `id:` (which the SDK's decoder keeps).
    with stack(("--sim-ttft", "0.8", "--sim-token-delay", "0.02"), ("--heartbeat", "0.1")) as s:
        yield s


def test_openai_sdk_survives_heartbeats_during_a_long_prefill(slow_prefill: Stack) -> None:
    s = slow_prefill
    client = openai.OpenAI(base_url=f"{s.base}/v1", api_key="unused", max_retries=0)
    start = chat_start(MESSAGES, temperature=0, max_tokens=12)
    want_chat, _ = direct_generate(s.worker.address, start)
    stream = client.chat.completions.create(
        model="",
        messages=MESSAGES,
        temperature=0,
        max_tokens=12,
        stream=True,  # type: ignore[arg-type]
    )
    got = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(got) == want_chat
    start = chat_start([], temperature=0, max_tokens=12)
    start.prompt = "Once"
    want_text, _ = direct_generate(s.worker.address, start)
    streamed = client.completions.create(
        model="", prompt="Once", temperature=0, max_tokens=12, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == want_text


# -- 3: a Last-Event-ID resumed someone else's generation --------------------------------

KEYS = {"alice": "alice-key-0123456789abcdef", "mallory": "mallory-key-0123456789abcd"}


@pytest.fixture(scope="module")
def tenants() -> Iterator[Stack]:
    env = {"SLUICE_API_KEYS": ",".join(f"{name}:{key}" for name, key in KEYS.items())}
    with stack(("--sim-token-delay", "0.005"), (), edge_env=env) as s:
        yield s


def _stream(s: Stack, key: str, body: dict[str, Any], last_id: str = "") -> httpx.Response:
    headers = {"authorization": f"Bearer {KEYS[key]}"}
    if last_id:
        headers["last-event-id"] = last_id
    return httpx.post(f"{s.base}/v1/chat/completions", json=body, headers=headers, timeout=30)


def test_another_keys_event_id_is_refused_and_a_changed_body_too(tenants: Stack) -> None:
    body = {"messages": MESSAGES, "max_tokens": 10, "temperature": 0, "stream": True}
    whole = _stream(tenants, "alice", body)
    assert whole.status_code == 200
    events = [e for e in parse_sse(whole.content) if "id" in e]
    mid = events[3]["id"]
    stolen = _stream(tenants, "mallory", body, mid)
    assert stolen.status_code == 403
    assert stolen.json()["error"]["code"] == "stream_not_yours"
    other = {**body, "messages": [{"role": "user", "content": "something else"}]}
    changed = _stream(tenants, "alice", other, mid)
    assert changed.status_code == 400
    assert changed.json()["error"]["code"] == "resume_body_mismatch"
    own = _stream(tenants, "alice", body, mid)
    assert own.status_code == 200
    resumed = [e for e in parse_sse(own.content) if "id" in e]
    assert [e["data"] for e in resumed] == [e["data"] for e in events[4:]]


# -- 4: a client that sends part of its body and leaves ---------------------------------


def test_a_client_leaving_mid_body_is_a_disconnect_not_a_500(slow_prefill: Stack) -> None:
    s = slow_prefill
    route = 'route="/v1/chat/completions"'
    before = metric(s.base, "sluice_edge_client_disconnects_total", "{" + route + "}")
    sock = socket.create_connection(("127.0.0.1", s.edge.port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b'content-length: 1000\r\n\r\n{"messages": [{"role": "us'
    )
    sock.close()
    key = "sluice_edge_client_disconnects_total"
    eventually(
        lambda: metric(s.base, key, "{" + route + "}") == before + 1,
        what="the edge counted the client's disconnect",
    )
    text = httpx.get(f"{s.base}/metrics", timeout=5).text
    assert 'status="500"' not in text
    assert "Traceback" not in s.edge.log()


# -- 5: a streamed request over HTTP/1.0 -------------------------------------------------


def _post_http_1_0(port: int, body: dict[str, Any]) -> tuple[bytes, bytes]:
    """POST a chat completion over HTTP/1.0 on a raw socket: (head, body) of the answer."""
    payload = orjson.dumps(body)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.0\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(payload) + payload
    )
    raw = _read_all(sock)
    sock.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    return head, rest


def test_a_stream_over_http_1_0_is_refused_clearly_not_chunked(slow_prefill: Stack) -> None:
    port = slow_prefill.edge.port
    head, body = _post_http_1_0(port, {"messages": MESSAGES, "max_tokens": 3, "stream": True})
    assert head.startswith(b"HTTP/1.1 505 ")
    assert b"transfer-encoding" not in head.lower()
    assert orjson.loads(body)["error"]["code"] == "http_version_not_supported"
    # Not streamed, the same request is answered over HTTP/1.0 (a Content-Length body).
    head, body = _post_http_1_0(port, {"messages": MESSAGES, "max_tokens": 3})
    assert head.startswith(b"HTTP/1.1 200 ") and b"content-length" in head.lower()
    assert orjson.loads(body)["choices"][0]["message"]["content"]


# -- 6: no bound on request heads: size, count, time ---------------------------------------


@pytest.fixture(scope="module")
def strict_heads() -> Iterator[Stack]:
    edge = ("--header-timeout", "1", "--max-header-bytes", "4096", "--max-headers", "20")
    with stack(("--sim-token-delay", "0"), edge) as s:
        yield s


def _read_all(sock: socket.socket, limit_s: float = 10.0) -> bytes:
    sock.settimeout(limit_s)
    out = b""
    try:
        while part := sock.recv(65536):
            out += part
    except (ConnectionResetError, BrokenPipeError):
        pass
    return out


def test_a_client_sending_its_head_slowly_is_cut_off(strict_heads: Stack) -> None:
    sock = socket.create_connection(("127.0.0.1", strict_heads.edge.port))
    t0 = time.monotonic()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
    sock.settimeout(0.2)
    raw = b""
    for byte in b"x-slow-header: " + b"a" * 40:  # one byte every 0.2 s: 11 s in all
        try:
            sock.send(bytes((byte,)))
            raw += sock.recv(65536)
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            break
        if raw:
            break
    raw += _read_all(sock)
    sock.close()
    elapsed = time.monotonic() - t0
    assert raw.startswith(b"HTTP/1.1 408 "), raw[:80]
    assert 0.9 < elapsed < 4.0


def _unread_by(pid: int, server_port: int, client_port: int) -> int:
    """Bytes in the receive queue of `pid`'s end of the connection (/proc/net/tcp)."""
    want = (f"0100007F:{server_port:04X}", f"0100007F:{client_port:04X}")
    for line in open(f"/proc/{pid}/net/tcp").read().splitlines()[1:]:
        fields = line.split()
        if (fields[1], fields[2]) == want:
            return int(fields[4].split(":")[1], 16)
    raise AssertionError("no such connection")


def test_a_head_sent_while_the_edge_stalls_is_answered_not_timed_out(
    strict_heads: Stack,
) -> None:
    """The head timeout is the client's: a head that waited in the socket while the edge's
    loop could not run (here: the process stopped past `--header-timeout`) is read and
    answered when it runs again, not refused with a 408 and a reset (issue 22, target 3:
    20,000 streams arriving at once)."""
    edge, port = strict_heads.edge, strict_heads.edge.port
    sock = socket.create_connection(("127.0.0.1", port))
    client_port = sock.getsockname()[1]
    try:
        sock.sendall(b"GET /hea")  # the head's timer starts once the edge read this
        eventually(lambda: _unread_by(edge.pid, port, client_port) == 0, what="the edge read it")
        os.kill(edge.pid, signal.SIGSTOP)
        try:
            sock.sendall(b"lthz HTTP/1.1\r\nhost: x\r\n\r\n")
            due = time.monotonic() + 1.5  # past the 1 s timeout while the edge is stopped
            eventually(lambda: time.monotonic() > due, what="the timeout passed")
        finally:
            os.kill(edge.pid, signal.SIGCONT)
        sock.settimeout(10)
        raw = sock.recv(65536)
    finally:
        sock.close()
    assert raw.startswith(b"HTTP/1.1 200 "), raw[:80]


def test_oversized_or_too_many_headers_get_431_and_a_closed_connection(
    strict_heads: Stack,
) -> None:
    port = strict_heads.edge.port
    for head in (
        b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"b" * 5000 + b"\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + b"".join(b"x-h%d: v\r\n" % i for i in range(30)),
    ):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(head + b"\r\n")
        raw = _read_all(sock)
        sock.close()
        assert raw.startswith(b"HTTP/1.1 431 "), raw[:80]
        assert b"connection: close" in raw.lower()
        assert orjson.loads(raw.partition(b"\r\n\r\n")[2])["error"]["code"] == "http_431"
    # Within the bounds, the same edge answers as usual.
    assert (
        httpx.get(f"{strict_heads.base}/healthz", headers={"x-fine": "y" * 1000}).status_code == 200
    )


# -- 2: a frozen worker held requests for as long as it was frozen -----------------------

DETECTION_BOUND_S = 2.0 + 2.0 + 2.0  # --keepalive + --keepalive-timeout + a reconnect


@pytest.mark.chaos
def test_a_frozen_worker_is_taken_out_within_the_keepalive_bound() -> None:
    workers = [start_worker("--engine", "sim", "--sim-token-delay", "0.02") for _ in range(2)]
    edge = None
    try:
        args = [a for w in workers for a in ("--worker", w.address)]
        edge = start_edge(*args, "--continue-on-failure", "never", env=EDGE_ENV)
        base = f"http://{edge.address}"
        wait_ready(base)
        frozen, alive = workers
        # A stream mid-way on the worker that freezes.
        body = {"messages": MESSAGES, "max_tokens": 400, "min_tokens": 400, "stream": True}
        raw = b""
        with httpx.Client(timeout=30) as c:
            while True:  # sessions pick the worker: find one that lands on `frozen`
                key = f"s-{time.monotonic_ns()}"
                probe = c.post(
                    f"{base}/v1/completions",
                    json={"prompt": "x", "max_tokens": 1},
                    headers={"x-session-id": key},
                )
                if probe.headers["x-sluice-worker"] == worker_key(frozen.address):
                    break
            with c.stream(
                "POST", f"{base}/v1/chat/completions", json=body, headers={"x-session-id": key}
            ) as resp:
                parts = resp.iter_bytes()
                while raw.count(b"\ndata: {") < 3:
                    raw += next(parts)
                os.kill(frozen.pid, signal.SIGSTOP)
                t0 = time.monotonic()
                # A request sent to the frozen worker now gets nothing, then is retried.
                with ThreadPoolExecutor(1) as pool:
                    caught = pool.submit(
                        httpx.post,
                        f"{base}/v1/completions",
                        json={"prompt": "x", "max_tokens": 2},
                        headers={"x-session-id": key},
                        timeout=30,
                    )
                    raw += b"".join(parts)  # ends: with an error event, not after the freeze
                    ended_after = time.monotonic() - t0
                    caught_status = caught.result().status_code
                    caught_after = time.monotonic() - t0
            # New requests, with the frozen worker's session too, are all answered.
            statuses = [
                c.post(
                    f"{base}/v1/completions",
                    json={"prompt": "x", "max_tokens": 2},
                    headers={"x-session-id": key},
                ).status_code
                for _ in range(6)
            ]
            out_after = time.monotonic() - t0
            ready = c.get(f"{base}/readyz").json()
        os.kill(frozen.pid, signal.SIGCONT)
        print(f"frozen worker: stream ended after {ended_after:.2f}s, out by {out_after:.2f}s")
        assert ended_after < DETECTION_BOUND_S
        assert caught_status == 200 and caught_after < DETECTION_BOUND_S + 1.0
        events = [e for e in parse_sse(raw) if "data" in e]
        assert events[-1].get("event") == "error", events[-2:]
        assert orjson.loads(events[-1]["data"])["error"]["retryable"] is True
        assert statuses == [200] * 6
        assert out_after < DETECTION_BOUND_S + 1.0
        serving = {w["worker"]: w["serving"] for w in ready["workers"]}
        assert serving == {worker_key(frozen.address): False, worker_key(alive.address): True}
    finally:
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, signal.SIGCONT)
        if edge is not None:
            edge.kill()
        for w in workers:
            w.kill()


# -- 9: detached browser streams were not counted against the key's stream limit ----------


@pytest.fixture(scope="module")
def two_streams_a_key() -> Iterator[Stack]:
    env = {"SLUICE_API_KEYS": f"alice:{KEYS['alice']}"}
    worker = ("--sim-token-delay", "0.01", "--sim-answer-tokens", "30")
    edge = ("--max-streams-per-key", "2", "--stream-grace", "3")
    with stack(worker, edge, edge_env=env) as s:
        yield s


def test_detached_streams_hold_their_keys_slots_until_read_or_expired(
    two_streams_a_key: Stack,
) -> None:
    s = two_streams_a_key
    auth = {"authorization": f"Bearer {KEYS['alice']}"}
    body = {"messages": MESSAGES, "max_tokens": 20}

    def create() -> httpx.Response:
        return httpx.post(f"{s.base}/v1/streams", json=body, headers=auth, timeout=10)

    first, second = create(), create()
    assert (first.status_code, second.status_code) == (201, 201)
    third = create()
    assert third.status_code == 429
    assert third.json()["error"]["code"] == "concurrency_limit_exceeded"
    chat = httpx.post(f"{s.base}/v1/chat/completions", json=body, headers=auth, timeout=10)
    assert chat.status_code == 429  # the detached ones count for every generation route
    # Reading a link to its end frees its slot ...
    read = httpx.get(f"{s.base}{first.json()['stream_url']}", timeout=30)
    assert read.status_code == 200 and "data: [DONE]" in read.text
    assert create().status_code == 201
    assert create().status_code == 429  # the unread second one still holds its slot ...
    # ... until the stream grace runs out with nobody reading it.
    eventually(
        lambda: create().status_code == 201,
        what="the unread stream's slot freed after its grace",
        timeout=6.0,
    )


def test_a_pipelined_request_after_a_large_body_is_not_taken_for_a_large_head(
    strict_heads: Stack,
) -> None:
    """Review finding: the bytes of a body read together with the next request's head
    counted as head bytes (a false 431)."""
    big = orjson.dumps({"messages": MESSAGES, "max_tokens": 1, "padding": "p" * 20_000})
    first = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(big) + big
    )
    sock = socket.create_connection(("127.0.0.1", strict_heads.edge.port))
    # The large body's tail and the start of the next head in one write, the head's end
    # in another: the edge reads the tail and the unfinished head together.
    sock.sendall(first[:-5000])
    sock.sendall(first[-5000:] + b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
    time.sleep(0.2)  # the slow part of a pipelining client: its head arrives in two reads
    sock.sendall(b"connection: close\r\n\r\n")
    raw = _read_all(sock)
    sock.close()
    assert raw.count(b"HTTP/1.1 ") == 2 and b" 431 " not in raw, raw[:200]
