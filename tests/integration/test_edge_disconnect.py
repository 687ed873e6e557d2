"""Time-sensitive behaviour: heartbeats during prefill, a client leaving aborts the engine
request at once, and a slow reader holds back neither memory nor other streams."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import orjson
import pytest

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from tests.integration.edge_fixtures import (
    Stack,
    chat_start,
    chat_text,
    chunks,
    data_events,
    dechunk,
    direct_generate,
    metric,
    parse_sse,
    raw_request,
    read_to_end,
    read_until,
    rss_bytes,
    stack,
    stream_raw,
    worker_stats,
)
from tests.waits import eventually

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "Tell a long story."}]
ABORT_BUDGET_S = 0.100


def chat_body(**over: Any) -> dict[str, Any]:
    return {"model": "", "messages": MESSAGES, "temperature": 0, **over}


def addr(s: Stack) -> tuple[str, int]:
    host, port = s.edge.address.split(":")
    return host, int(port)


def abort_delay(s: Stack, sock: socket.socket) -> float:
    """Close the client socket; seconds until the worker has nothing running or waiting."""
    with grpc.insecure_channel(s.worker.address) as channel:
        stub = pb_grpc.GenerationStub(channel)
        before = stub.GetStats(pb.GetStatsRequest(), timeout=5)
        assert before.running + before.waiting == 1, before  # the generation is live
        t0 = time.monotonic()
        sock.close()
        eventually(
            lambda: idle(stub.GetStats(pb.GetStatsRequest(), timeout=5)),
            what="the engine request is aborted",
            timeout=5,
            interval=0.001,  # the delay is what is measured: poll finely
        )
        return time.monotonic() - t0


def idle(stats: pb.WorkerStats) -> bool:
    return stats.running + stats.waiting == 0


# -- a long prefill ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def prefill() -> Iterator[Stack]:
    with stack(("--sim-ttft", "2", "--sim-token-delay", "0.001"), ("--heartbeat", "0.2")) as s:
        yield s


def test_heartbeats_during_a_long_prefill(prefill: Stack) -> None:
    t0 = time.monotonic()
    arrivals: list[tuple[float, bytes]] = []
    body = chat_body(max_tokens=5, stream=True)
    with httpx.stream("POST", f"{prefill.base}{CHAT}", json=body, timeout=30) as resp:
        headers_at = time.monotonic() - t0
        arrivals.extend((time.monotonic() - t0, part) for part in resp.iter_bytes())
    raw = b"".join(part for _, part in arrivals)
    events = parse_sse(raw)
    comments = [e for e in events if "comment" in e]
    first_delta = next(i for i, e in enumerate(events) if _has_content(e))
    # 2 s of prefill with a 0.2 s heartbeat: the 200 goes out early, then comments flow.
    assert headers_at < 1.0
    assert len([e for e in events[:first_delta] if "comment" in e]) >= 5
    assert len(comments) >= 5
    assert chat_text(chunks(events))  # and the answer still arrives whole


def _has_content(event: dict[str, str]) -> bool:
    data = event.get("data", "")
    if not data.startswith("{"):
        return False
    choices = orjson.loads(data)["choices"]
    return bool(choices and choices[0]["delta"].get("content"))


def test_disconnect_during_prefill_aborts_at_once(prefill: Stack) -> None:
    sock = raw_request(addr(prefill), CHAT, chat_body(max_tokens=5, stream=True))
    read_until(sock, b"data: {")  # the 200 and the role chunk: prefill is under way
    delay = abort_delay(prefill, sock)
    print(f"disconnect -> abort during prefill: {delay * 1000:.1f} ms")
    assert delay < ABORT_BUDGET_S


# -- decoding ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def decode() -> Iterator[Stack]:
    with stack(("--sim-ttft", "0.01", "--sim-token-delay", "0.005")) as s:
        yield s


def test_disconnect_mid_stream_aborts_within_100ms(decode: Stack) -> None:
    before = metric(
        decode.base, "sluice_edge_client_disconnects_total", '{route="/v1/chat/completions"}'
    )
    body = chat_body(max_tokens=1000, min_tokens=1000, stream=True)
    sock = raw_request(addr(decode), CHAT, body)
    read_until(sock, b"data: {", count=4)
    delay = abort_delay(decode, sock)
    print(f"disconnect -> abort mid-stream: {delay * 1000:.1f} ms")
    assert delay < ABORT_BUDGET_S
    after = metric(
        decode.base, "sluice_edge_client_disconnects_total", '{route="/v1/chat/completions"}'
    )
    assert after == before + 1


def test_disconnect_of_a_non_streaming_request_aborts_too(decode: Stack) -> None:
    sock = raw_request(addr(decode), CHAT, chat_body(max_tokens=1000, min_tokens=1000))
    with grpc.insecure_channel(decode.worker.address) as channel:
        stub = pb_grpc.GenerationStub(channel)
        eventually(
            lambda: stub.GetStats(pb.GetStatsRequest(), timeout=5).running,
            what="the generation runs on the worker",
            timeout=5,
            interval=0.005,
        )
    delay = abort_delay(decode, sock)
    print(f"disconnect -> abort (non-streaming): {delay * 1000:.1f} ms")
    assert delay < ABORT_BUDGET_S


# -- a slow reader ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def firehose() -> Iterator[Stack]:
    """Tokens as fast as the sim makes them; room for very long generations."""
    worker = (
        "--sim-token-delay",
        "0",
        "--max-model-len",
        "2000000",
        "--sim-kv-tokens",
        "100000000",
    )
    # Small kernel send buffers, so a client that stops reading stalls the edge's writes
    # after kilobytes rather than megabytes.
    edge = ("--stream-buffer-bytes", "16384", "--socket-sndbuf", "32768")
    with stack(worker, edge) as s:
        yield s


def timed_stream(s: Stack, body: dict[str, Any]) -> tuple[float, str]:
    t0 = time.monotonic()
    _, raw = stream_raw(s.base, CHAT, body)
    return time.monotonic() - t0, chat_text(chunks(parse_sse(raw)))


def test_slow_reader_does_not_slow_a_fast_one_or_grow_memory(firehose: Stack) -> None:
    fast_body = chat_body(max_tokens=2000, min_tokens=2000, stream=True)
    baseline, want = timed_stream(firehose, fast_body)
    rss_before = rss_bytes(firehose.edge.pid)
    merged_before = metric(firehose.base, "sluice_edge_merged_chunks_total")
    # A client that asks for 200k tokens (~1 MB of text) and stops reading, with a tiny
    # socket buffer: the edge's writes stall, its per-stream buffer fills, and it stops
    # pulling from the worker.
    slow_body = chat_body(max_tokens=200_000, min_tokens=200_000, stream=True)
    slow = raw_request(addr(firehose), CHAT, slow_body, 4096)
    try:
        head = read_until(slow, b"data: {", count=2)
        # The worker generates on into its log while the edge holds back: wait until it
        # has made all of it, so the edge had every chance to buffer what it should not.
        eventually(
            lambda: idle(worker_stats(firehose.worker.address)),
            what="the worker generated all 200k tokens",
            timeout=60,
        )
        rss_stalled = rss_bytes(firehose.edge.pid)
        elapsed, got = timed_stream(firehose, fast_body)
        rss_later = rss_bytes(firehose.edge.pid)
        assert got == want
        print(f"fast stream: {baseline:.3f}s alone, {elapsed:.3f}s next to a stalled reader")
        assert elapsed < 3 * baseline + 0.5
        mib = 1 << 20
        print(f"edge RSS MiB: {rss_before / mib:.1f} {rss_stalled / mib:.1f} {rss_later / mib:.1f}")
        assert rss_later - rss_before < 32 * mib
        # Still held open, not dropped; nothing merged yet because the writer is stuck.
        assert metric(firehose.base, "sluice_edge_streams_in_flight") == 1
        # Now read it all: the backlog arrives merged, and the text is whole.
        raw = head + read_to_end(slow)
    finally:
        slow.close()
    assert metric(firehose.base, "sluice_edge_merged_chunks_total") > merged_before
    events = chunks(parse_sse(dechunk(raw)))
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert len(chat_text(events).split(" ")) == 200_000 + 1  # every token, one space each


def test_slow_reader_gets_merged_events_with_the_exact_text(firehose: Stack) -> None:
    n = 20_000
    start = chat_start(MESSAGES, temperature=0, max_tokens=n, min_tokens=n, ignore_eos=True)
    want, final = direct_generate(firehose.worker.address, start)
    merged_before = metric(firehose.base, "sluice_edge_merged_chunks_total")
    body = chat_body(max_tokens=n, min_tokens=n, ignore_eos=True, stream=True)
    sock = raw_request(addr(firehose), CHAT, body, 4096)
    try:
        eventually(  # fall behind: the whole generation is made before a byte is read
            lambda: idle(worker_stats(firehose.worker.address)),
            what="the worker generated every token",
            timeout=30,
        )
        raw = read_to_end(sock)
    finally:
        sock.close()
    events = parse_sse(dechunk(raw))
    got = chunks(events)
    assert chat_text(got) == want
    assert got[-1]["choices"][0]["finish_reason"] == "length"
    deltas = [c for c in got if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(deltas) < final.usage.completion_tokens  # merged: fewer events than tokens
    assert metric(firehose.base, "sluice_edge_merged_chunks_total") > merged_before
    assert len(data_events(events)) == len(got) + 1
