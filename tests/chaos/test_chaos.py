"""Chaos: real processes killed, frozen and flooded under load; nothing may be lost.

Every stream either completes gaplessly (every token, ids in order, `[DONE]`) or ends
with a well-formed `event: error` (an OpenAI error object with `retryable`), never a cut
connection, a hang or a 500. Each case is bounded in time; traffic goes to 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from tests.integration.edge_fixtures import (
    CODEC,
    EDGE_ENV,
    parse_sse,
    rss_bytes,
    wait_ready,
    worker_stats,
)
from tests.procs import Proc, start_edge, start_worker
from tests.waits import eventually

pytestmark = pytest.mark.chaos
MESSAGES = [{"role": "user", "content": "Tell me about rivers and the sea."}]
CHAT = "/v1/chat/completions"
TOKEN = b'"delta":{"content":'  # in a chat chunk that carries a token (not the role's)


@dataclass
class Outcome:
    """How one stream ended."""

    status: int
    events: list[dict[str, str]]
    error: dict[str, Any] | None = None
    cut: str = ""  # the transport error if the connection was cut

    @property
    def tokens(self) -> int:
        n = 0
        for e in self.events:
            if e["data"].startswith("{") and e.get("event") != "error":
                choices = orjson.loads(e["data"])["choices"]
                if choices and choices[0]["delta"].get("content"):
                    n += len(choices[0]["delta"]["content"].split())
        return n


def stream(
    base: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    under_way: threading.Event | None = None,
) -> Outcome:
    """One stream to its end; `under_way` is set once its first token arrived."""
    try:
        with httpx.stream("POST", f"{base}{CHAT}", json=body, headers=headers, timeout=60) as r:
            raw = b""
            for part in r.iter_bytes():
                raw += part
                if under_way is not None and TOKEN in raw:
                    under_way.set()
            status = r.status_code
    except httpx.HTTPError as err:
        return Outcome(0, [], cut=repr(err))
    if status != 200:
        return Outcome(status, [], error=orjson.loads(raw)["error"])
    events = [e for e in parse_sse(raw) if "data" in e]
    last = events[-1] if events else {}
    error = orjson.loads(last["data"])["error"] if last.get("event") == "error" else None
    return Outcome(status, events, error)


def summary(events: list[dict[str, str]]) -> tuple[str, list[str], Any]:
    """What a stream says: its text, its finish reasons, its usage, and its last data."""
    text, finishes, usage = [], [], None
    for e in events:
        if not e["data"].startswith("{"):
            continue
        chunk = orjson.loads(e["data"])
        for c in chunk["choices"]:
            text.append(c["delta"].get("content") or "")
            if c["finish_reason"]:
                finishes.append(c["finish_reason"])
        usage = chunk.get("usage") or usage
    return "".join(text), finishes, (usage, events[-1]["data"] if events else None)


def assert_nothing_lost(outcomes: list[Outcome], tokens: int) -> dict[str, int]:
    """Each stream whole and gapless, or ended by a well-formed error; counts by kind."""
    kinds = {"whole": 0, "error": 0, "refused": 0}
    for o in outcomes:
        assert not o.cut, o.cut
        if o.status != 200:
            assert o.status in (429, 503) and o.error is not None, (o.status, o.error)
            kinds["refused"] += 1
            continue
        ids = [e["id"] for e in o.events if "id" in e]
        seqs = [CODEC.parse(i).seq for i in ids]
        assert seqs == list(range(len(seqs))), "an event is missing or repeated"
        if o.error is None:
            assert o.events[-1]["data"] == "[DONE]"
            assert o.tokens == tokens  # the sim's tokens are words: every one arrived
            kinds["whole"] += 1
        else:
            assert set(o.error) >= {"message", "type", "code", "retryable"}, o.error
            assert all(e["data"] != "[DONE]" for e in o.events)
            kinds["error"] += 1
    return kinds


@contextlib.contextmanager
def fleet(n_workers: int, worker_args: tuple[str, ...], edge_args: tuple[str, ...] = ()):
    workers = [start_worker("--engine", "sim", *worker_args) for _ in range(n_workers)]
    edges: list[Proc] = []
    try:
        args = [a for w in workers for a in ("--worker", w.address)]
        edges.append(start_edge(*args, *edge_args, env=EDGE_ENV))
        wait_ready(f"http://{edges[0].address}")
        yield workers, edges
    finally:
        for p in [*edges, *workers]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
            p.kill()


def many(base: str, n: int, body: dict[str, Any], during: Any = None) -> list[Outcome]:
    """`n` concurrent streams; `during()` runs once they are all under way (each has its
    first token)."""
    under_way = [threading.Event() for _ in range(n)]
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(stream, base, body, None, e) for e in under_way]
        if during is not None:
            eventually(
                lambda: all(e.is_set() for e in under_way),
                what=f"all {n} streams under way",
                timeout=30,
                detail=lambda: sum(e.is_set() for e in under_way),
            )
            during()
        return [f.result(timeout=90) for f in futures]


# -- the cases ---------------------------------------------------------------------------


def test_kill_9_a_worker_mid_stream_under_20_streams() -> None:
    body = {"messages": MESSAGES, "max_tokens": 80, "min_tokens": 80, "temperature": 0.8,
            "stream": True}  # fmt: skip
    with fleet(2, ("--sim-token-delay", "0.02")) as (workers, edges):
        base = f"http://{edges[0].address}"

        def kill() -> None:  # the streams are under way: chaos strikes mid-stream
            workers[0].kill()

        outcomes = many(base, 20, body, kill)
    kinds = assert_nothing_lost(outcomes, 80)
    assert kinds["whole"] == 20, kinds  # sampled streams are continued on the survivor


def test_sigterm_a_worker_under_20_streams_drains_it_and_the_rest_go_elsewhere() -> None:
    body = {"messages": MESSAGES, "max_tokens": 40, "min_tokens": 40, "stream": True}
    with fleet(2, ("--sim-token-delay", "0.02", "--drain-grace", "10")) as (workers, edges):
        base = f"http://{edges[0].address}"

        def term() -> None:  # the streams are under way
            workers[0].proc.send_signal(signal.SIGTERM)

        outcomes = many(base, 20, body, term)
        later = many(base, 10, body)  # after the drain began: the other worker serves
        assert workers[0].proc.wait(15) == 0
    assert assert_nothing_lost([*outcomes, *later], 40)["whole"] == 30


def test_kill_9_the_edge_and_resume_every_stream_through_another() -> None:
    body = {"messages": MESSAGES, "max_tokens": 60, "min_tokens": 60, "temperature": 0,
            "stream": True}  # fmt: skip
    worker_args = ("--sim-token-delay", "0.02")
    with fleet(1, worker_args, ("--openai-detach-grace", "10")) as (workers, edges):
        first = edges[0]
        second = start_edge("--worker", workers[0].address, env=EDGE_ENV)
        edges.append(second)
        wait_ready(f"http://{second.address}")
        heads: list[bytes] = []
        lock = threading.Lock()
        under_way = [threading.Event() for _ in range(10)]

        def head_of_one(got_a_token: threading.Event) -> None:
            with contextlib.suppress(httpx.HTTPError):
                with httpx.stream(
                    "POST", f"http://{first.address}{CHAT}", json=body, timeout=30
                ) as r:
                    raw = b""
                    for part in r.iter_bytes():
                        raw += part
                        if TOKEN in raw:
                            got_a_token.set()
            with lock:
                heads.append(raw)

        threads = [threading.Thread(target=head_of_one, args=(e,)) for e in under_way]
        for t in threads:
            t.start()
        eventually(lambda: all(e.is_set() for e in under_way), what="all 10 streams under way")
        first.kill()
        for t in threads:
            t.join(30)
        reference = stream(f"http://{second.address}", body)
        assert reference.events[-1]["data"] == "[DONE]"
        for raw in heads:
            got = [e for e in parse_sse(raw) if "data" in e and "id" in e]
            assert got, "no event before the kill"
            tail = stream(
                f"http://{second.address}", body, headers={"last-event-id": got[-1]["id"]}
            )
            assert tail.status == 200 and tail.error is None
            # Tokens the worker made while nobody read arrive merged: compare what the
            # stream says (text, finish, usage), not how it was cut into events.
            assert summary([*got, *tail.events]) == summary(reference.events)
            seqs = [CODEC.parse(e["id"]).seq for e in [*got, *tail.events] if "id" in e]
            assert seqs == list(range(len(seqs)))


def test_a_10x_burst_over_capacity_is_refused_fast_or_served() -> None:
    # 4 batch slots + 4 waiting: 80 concurrent streams are 10x what the worker takes.
    body = {"messages": MESSAGES, "max_tokens": 20, "min_tokens": 20, "stream": True}
    args = ("--sim-token-delay", "0.02", "--max-num-seqs", "4", "--max-waiting", "4")
    with fleet(1, args) as (_, edges):
        t0 = time.monotonic()
        outcomes = many(f"http://{edges[0].address}", 80, body)
        elapsed = time.monotonic() - t0
    kinds = assert_nothing_lost(outcomes, 20)
    assert kinds["refused"] > 0 and kinds["whole"] >= 8, kinds
    assert all(o.error["code"] == "overloaded" for o in outcomes if o.status == 429)
    assert elapsed < 30


def test_1000_abort_cycles_free_the_engine_and_keep_memory_flat() -> None:
    body = {"messages": MESSAGES, "max_tokens": 500, "min_tokens": 500, "stream": True}
    with fleet(
        1,
        (
            "--sim-token-delay",
            "0.005",
        ),
    ) as (workers, edges):
        base = f"http://{edges[0].address}"

        def cycles(n: int) -> None:
            with httpx.Client(timeout=10) as c:
                for _ in range(n):
                    with c.stream("POST", f"{base}{CHAT}", json=body) as r:
                        for part in r.iter_bytes():
                            if b"data: {" in part:
                                break  # leave mid-stream

        cycles(100)  # warm: allocator and caches settle
        before = rss_bytes(edges[0].pid)
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(cycles, [225] * 4))
        after = rss_bytes(edges[0].pid)
        eventually(
            lambda: "sluice_edge_streams_in_flight 0" in httpx.get(f"{base}/metrics").text,
            what="no stream in flight at the edge",
        )
        eventually(
            lambda: (st := worker_stats(workers[0].address)).running + st.waiting == 0,
            what="the engine runs no aborted generation",
        )
        reference = stream(base, {**body, "max_tokens": 5, "min_tokens": 5})
    print(f"edge RSS {before / 2**20:.1f} -> {after / 2**20:.1f} MiB over 900 aborts")
    assert after - before < 16 * 2**20
    assert_nothing_lost([reference], 5)


def test_a_stalled_reader_beside_fast_ones() -> None:
    fast = {"messages": MESSAGES, "max_tokens": 200, "min_tokens": 200, "stream": True}
    with fleet(
        1,
        (
            "--sim-token-delay",
            "0",
        ),
    ) as (_, edges):
        base = f"http://{edges[0].address}"
        import socket

        stalled = socket.create_connection(("127.0.0.1", edges[0].port))
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        big = orjson.dumps({**fast, "max_tokens": 100_000, "min_tokens": 100_000})
        stalled.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
            b"\r\ncontent-length: %d\r\n\r\n" % len(big) + big
        )
        stalled.recv(100)  # it started; now it reads nothing more
        try:
            t0 = time.monotonic()
            outcomes = many(base, 8, fast)
            elapsed = time.monotonic() - t0
        finally:
            stalled.close()
    assert assert_nothing_lost(outcomes, 200)["whole"] == 8
    assert elapsed < 10
