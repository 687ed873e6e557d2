"""Usage, budgets and the audit log with real processes: two edge replicas x two
processes sharing one real redis-server and one sim worker. Usage in the ledger equals,
exactly, the sum of the usage fields the clients received (streamed and whole answers,
chat and completions, a resumed stream that replays its final counted once); a key past
its daily budget gets 429 `budget_exceeded` with the reset time; the figures survive an
edge restart. The audit log of a single edge: one line per request, bodies only when
asked, a redacted field and an API key never in it."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from edge.stream.ids import PART_DONE
from tests.integration.edge_fixtures import CODEC, EDGE_ENV, data_events, parse_sse, wait_ready
from tests.procs import Proc, start_edge, start_worker
from tests.redis_proc import RedisServer, redis_server
from tests.waits import eventually

pytestmark = pytest.mark.slow

ADMIN = "usage-admin-key-0123456789"
KEYS = {"alpha": "team-a", "beta": "team-a", "gamma": "team-g", "delta": "d", "broke": "team-g"}
ENV = {**EDGE_ENV, "SLUICE_API_KEYS": ",".join(f"{k}:sk-{k}-0123456789abcdef" for k in KEYS)}
BUDGET = 40  # tokens a day for "broke"
TENANTS = [arg for k, t in KEYS.items() for arg in ("--key-tenant", f"{k}={t}")]


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer sk-{key}-0123456789abcdef"}


ADMIN_AUTH = {"authorization": f"Bearer {ADMIN}"}


@dataclass
class Fleet:
    redis: RedisServer
    worker: Proc
    edges: list[Proc]
    args: list[str]

    @property
    def bases(self) -> list[str]:
        return [f"http://{e.address}" for e in self.edges]


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with redis_server() as redis:
        worker = start_worker("--engine", "sim", "--sim-token-delay", "0.002")
        edges: list[Proc] = []
        args = ["--worker", worker.address, "--store-url", redis.url, "--admin-key", ADMIN]
        args += [*TENANTS, "--key-budget", f"broke={BUDGET}/day"]
        try:
            for _ in range(2):
                edges.append(start_edge("--processes", "2", *args, env=ENV))
            for e in edges:
                wait_ready(f"http://{e.address}")
            yield Fleet(redis, worker, edges, args)
        finally:
            for e in edges:
                e.kill()
            worker.kill()


def usage_of(base: str, **params: str) -> dict[str, object]:
    r = httpx.get(f"{base}/admin/usage", params=params, headers=ADMIN_AUTH, timeout=5)
    assert r.status_code == 200, r.text
    return r.json()


def stream_usage(raw: bytes) -> dict[str, int]:
    """The usage of a streamed answer (include_usage: the one chunk that carries it)."""
    chunks = [orjson.loads(e["data"]) for e in data_events(parse_sse(raw)) if e["data"] != "[DONE]"]
    (usage,) = [c["usage"] for c in chunks if c.get("usage")]
    return usage


async def one(client: httpx.AsyncClient, base: str, key: str, i: int) -> dict[str, int]:
    """A request of one of four shapes; the usage its client received."""
    words = " ".join(["word"] * (i % 7 + 1))
    if i % 4 == 3:
        body = {"prompt": words, "max_tokens": 3 + i % 5, "stream": False}
        r = await client.post(f"{base}/v1/completions", json=body, headers=auth(key))
        assert r.status_code == 200, r.text
        return r.json()["usage"]
    body = {"messages": [{"role": "user", "content": words}], "max_tokens": 2 + i % 6}
    if i % 2:
        r = await client.post(f"{base}/v1/chat/completions", json=body, headers=auth(key))
        assert r.status_code == 200, r.text
        return r.json()["usage"]
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    r = await client.post(f"{base}/v1/chat/completions", json=body, headers=auth(key))
    assert r.status_code == 200, r.text
    return stream_usage(r.content)


def test_usage_over_two_replicas_equals_what_the_clients_were_told_and_survives_a_restart(fleet):
    received: dict[str, Counter[str]] = {k: Counter() for k in ("alpha", "beta", "gamma")}

    async def run() -> None:
        limits = httpx.Limits(max_keepalive_connections=0)  # spread over the processes
        async with httpx.AsyncClient(limits=limits, timeout=30) as client:
            jobs = [(k, i) for i in range(12) for k in received]
            got = await asyncio.gather(*(one(client, fleet.bases[i % 2], k, i) for k, i in jobs))
            for (k, _), u in zip(jobs, got, strict=True):
                received[k]["requests"] += 1
                received[k]["prompt_tokens"] += u["prompt_tokens"]
                received[k]["completion_tokens"] += u["completion_tokens"]
                received[k]["total_tokens"] += u["total_tokens"]
                received[k]["cached_tokens"] += u["prompt_tokens_details"]["cached_tokens"]

    asyncio.run(run())

    def per_key(base: str) -> dict[str, dict[str, int]]:
        return {k: dict(usage_of(base, key=k)["total"]) for k in received}

    want = {k: dict(c) for k, c in received.items()}
    eventually(lambda: per_key(fleet.bases[0]) == want, what="the ledger adds up", timeout=10)
    assert per_key(fleet.bases[1]) == want  # one figure for the fleet
    team_a = usage_of(fleet.bases[1], tenant="team-a")
    assert {row["key"] for row in team_a["data"]} == {"alpha", "beta"}
    assert team_a["total"]["requests"] == 24
    today = dt.datetime.now(dt.UTC).date().isoformat()
    rows = usage_of(fleet.bases[0], key="gamma", model="sim-model")["data"]
    assert [(r["day"], r["tenant"]) for r in rows] == [(today, "team-g")]

    # Prometheus: the usage counters of a replica's two processes, summed over replicas.
    def counted(base: str) -> float:
        text = httpx.get(f"{base}/metrics", headers=ADMIN_AUTH, timeout=5).text
        line = 'sluice_edge_usage_requests_total{key="alpha",tenant="team-a",model="sim-model"}'
        return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(line))

    eventually(lambda: sum(counted(b) for b in fleet.bases) == 12, what="the counters add up")

    # A restarted replica reads the same figures from Redis.
    fleet.edges[0].kill()
    fleet.edges[0] = start_edge("--processes", "2", *fleet.args, env=ENV)
    wait_ready(fleet.bases[0])
    assert per_key(fleet.bases[0]) == want


def test_a_resumed_stream_that_replays_its_final_counts_once(fleet):
    body = {
        "messages": [{"role": "user", "content": "count me once"}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    url = f"{fleet.bases[0]}/v1/chat/completions"

    def total() -> dict[str, int]:
        return usage_of(fleet.bases[0], key="delta")["total"]

    first = httpx.post(url, json=body, headers=auth("delta"), timeout=10)
    told = stream_usage(first.content)
    eventually(lambda: total()["total_tokens"] == told["total_tokens"], what="counted")
    # Resume from the finish chunk: the usage chunk comes again, the final noted again.
    ids = [e["id"] for e in parse_sse(first.content) if e.get("id")]
    assert CODEC.parse(ids[-3]).part != PART_DONE
    again = httpx.post(
        f"{fleet.bases[1]}/v1/chat/completions",
        json=body,
        headers={**auth("delta"), "last-event-id": ids[-3]},
        timeout=10,
    )
    assert again.status_code == 200 and stream_usage(again.content) == told
    # A generation after the resume: once it is counted, so is anything before it.
    third = stream_usage(httpx.post(url, json=body, headers=auth("delta"), timeout=10).content)
    want = told["total_tokens"] + third["total_tokens"]
    eventually(lambda: total()["total_tokens"] >= want, what="the third counted")
    assert total()["total_tokens"] == want and total()["requests"] == 2


def test_a_key_over_its_budget_gets_429_with_the_reset_time_and_a_stream_finishes(fleet):
    body = {"messages": [{"role": "user", "content": "spend"}], "max_tokens": 30}
    url = f"{fleet.bases[1]}/v1/chat/completions"
    first = httpx.post(url, json=body, headers=auth("broke"), timeout=10)
    assert first.status_code == 200  # under budget at admission; it ends past it
    spent = first.json()["usage"]["total_tokens"]
    assert spent > BUDGET

    def refused() -> httpx.Response | None:
        r = httpx.post(url, json=body, headers=auth("broke"), timeout=10)
        return r if r.status_code == 429 else None

    r = eventually(refused, what="the budget refuses the next generation", timeout=10)
    midnight = dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1)
    err = r.json()["error"]
    assert err["code"] == "budget_exceeded" and err["type"] == "insufficient_quota"
    assert err["resets_at"] == f"{midnight.isoformat()}T00:00:00Z"
    assert (err["budget_tokens"], err["budget_period"]) == (BUDGET, "day")
    assert err["used_tokens"] >= spent
    reset = dt.datetime.combine(midnight, dt.time(), dt.UTC).timestamp()
    wait = reset - dt.datetime.now(dt.UTC).timestamp()
    assert abs(int(r.headers["retry-after"]) - wait) <= 5
    # Another key of the same tenant is not refused: budgets are per key.
    ok = httpx.post(url, json=body, headers=auth("gamma"), timeout=10)
    assert ok.status_code == 200


def test_usage_filters_and_bad_ranges(fleet):
    base = fleet.bases[0]
    r = httpx.get(f"{base}/admin/usage", params={"from": "yesterday"}, headers=ADMIN_AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == "from"
    r = httpx.get(f"{base}/admin/usage", params={"from": "2020-01-01"}, headers=ADMIN_AUTH)
    assert r.status_code == 400  # more than a year
    assert httpx.get(f"{base}/admin/usage", headers=auth("alpha")).status_code == 403
    assert usage_of(base, key="nobody")["data"] == []


# -- the audit log ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def audited(
    fleet: Fleet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[tuple[str, Path]]]:
    """Two single-process edges before the fleet's worker: one auditing without bodies,
    one with (redacted)."""
    d = tmp_path_factory.mktemp("audit")
    worker = fleet.worker
    edges: list[tuple[Proc, Path]] = []
    redact = ["--audit-redact", "/request/messages/*/content", "--audit-redact", r"\d{4}-\d{4}"]
    try:
        for name, extra in (("plain", []), ("bodies", ["--audit-bodies", *redact])):
            path = d / f"{name}.log"
            args = ["--worker", worker.address, *TENANTS, "--audit-log", str(path), *extra]
            edges.append((start_edge(*args, env=ENV), path))
        for e, _ in edges:
            wait_ready(f"http://{e.address}")
        yield [(f"http://{e.address}", path) for e, path in edges]
    finally:
        for e, _ in edges:
            e.kill()


def audit_traffic(base: str) -> list[tuple[str, int, dict[str, int] | None]]:
    """Five requests (a stream, a whole answer, completions, a bad key, the models); what
    each line should say: (route, status, the usage the client got)."""
    secret = "my card is 1234-5678"
    chat = {"messages": [{"role": "user", "content": secret}], "max_tokens": 5}
    headers = {**auth("alpha"), "x-request-id": "trace-audit-1", "cookie": "sid=cookie-secret-1"}
    url = f"{base}/v1/chat/completions"
    streamed = {**chat, "stream": True, "stream_options": {"include_usage": True}}
    r1 = httpx.post(url, json=streamed, headers=headers, timeout=10)
    r2 = httpx.post(url, json=chat, headers=auth("gamma"), timeout=10)
    body = {"prompt": f"pin {secret}", "max_tokens": 3}
    r3 = httpx.post(f"{base}/v1/completions", json=body, headers=auth("beta"), timeout=10)
    r4 = httpx.post(url, json=chat, headers={"authorization": "Bearer sk-wrong-0123456789abcdef"})
    r5 = httpx.get(f"{base}/v1/models", headers=auth("alpha"))
    assert [r.status_code for r in (r1, r2, r3, r4, r5)] == [200, 200, 200, 401, 200]
    chat_route, completions = "/v1/chat/completions", "/v1/completions"
    return [
        (chat_route, 200, stream_usage(r1.content)),
        (chat_route, 200, r2.json()["usage"]),
        (completions, 200, r3.json()["usage"]),
        (chat_route, 401, None),
        ("/v1/models", 200, None),
    ]


def audit_lines(path: Path, n: int) -> list[dict[str, object]]:
    """The log's lines but the readiness probes' (the fixture's waits)."""

    def lines() -> list[dict[str, object]] | None:
        raw = path.read_bytes().splitlines() if path.exists() else []
        got = [line for line in map(orjson.loads, raw) if line["route"] != "/readyz"]
        return got if len(got) >= n else None

    found = eventually(lines, what=f"{n} audit lines in {path}", timeout=10)
    assert len(found) == n
    return found


def test_the_audit_log_has_a_line_per_request_bodies_only_when_asked_and_no_secret(audited):
    (_, plain), (_, bodies) = audited
    for base, path in audited:
        want = audit_traffic(base)
        lines = audit_lines(path, len(want))
        keys = [line["key"] for line in lines]
        assert keys == ["alpha", "gamma", "beta", None, "alpha"]
        assert [line["tenant"] for line in lines] == ["team-a", "team-g", "team-a", None, "team-a"]
        got = [(line["route"], line["status"]) for line in lines]
        assert got == [(route, status) for route, status, _ in want]
        for line, (_, _, usage) in zip(lines, want, strict=True):
            if usage is None:
                assert line["prompt_tokens"] is None and line["worker"] is None
                continue
            assert line["prompt_tokens"] == usage["prompt_tokens"]
            assert line["completion_tokens"] == usage["completion_tokens"]
            assert line["model"] == "sim-model" and line["finish"] in ("stop", "length")
            assert isinstance(line["latency_ms"], float) and line["latency_ms"] > 0
            assert line["worker"]  # the worker's address
        assert lines[0]["trace_id"] == "trace-audit-1"
        text = path.read_text()
        for secret in ("sk-alpha", "sk-gamma", "sk-beta", "sk-wrong", "cookie-secret", "Bearer"):
            assert secret not in text
        assert "1234-5678" not in text  # redacted with bodies, absent without
    plain_lines = audit_lines(plain, 5)
    assert all("request" not in line and "response" not in line for line in plain_lines)
    lines = audit_lines(bodies, 5)
    streamed, whole, completion = lines[0], lines[1], lines[2]
    # Bodies of API calls only: not a refused call's, a probe's or /metrics'.
    probes = [orjson.loads(ln) for ln in bodies.read_bytes().splitlines() if b"/readyz" in ln]
    assert probes and all("response" not in p for p in [lines[3], *probes])
    assert "response" in lines[4]  # /v1/models: an API call
    assert streamed["request"]["messages"] == [{"role": "user", "content": "[redacted]"}]
    assert streamed["request"]["max_tokens"] == 5
    assert completion["request"]["prompt"] == "pin my card is [redacted]"
    events = streamed["response"]
    assert (
        isinstance(events, list)
        and events[-1]["usage"]["completion_tokens"] == streamed["completion_tokens"]
    )
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert whole["response"]["object"] == "chat.completion"
    assert text  # the streamed answer, assembled from its events
