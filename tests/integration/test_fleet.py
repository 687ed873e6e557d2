"""One fleet: two edge replicas x two processes each, one real redis-server, sim
workers. Limits that hold across all of them, admin changes and session pins that reach
all of them. Each test uses its own API key (limits are per key).

The rate test sends new connections so the kernel spreads them over both processes of
both replicas; without the shared store each of the four would admit the whole rate.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass

import httpx
import orjson
import pytest

from edge.store.redis import RECOVER_S
from tests.integration.edge_fixtures import EDGE_ENV, wait_ready
from tests.procs import Proc, start_edge, start_worker
from tests.redis_proc import RedisServer, redis_server
from tests.waits import eventually, eventually_async

pytestmark = pytest.mark.slow

KEYS = ["rate", "streams", "tpm", "settle", "down", "closed", "control", "canary", "summed"]
KEYS += [f"ro{i}" for i in range(4)]  # rollout traffic, spread over keys (their limits)
ADMIN = "fleet-admin-key-0123456789"
ENV = {**EDGE_ENV, "SLUICE_API_KEYS": ",".join(f"{k}:sk-{k}-0123456789abcdef" for k in KEYS)}
RATE = 20.0
LIMITS = ["--rate-limit", str(RATE), "--max-streams-per-key", "2", "--tpm-limit", "600"]


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer sk-{key}-0123456789abcdef"}


@dataclass
class Fleet:
    redis: RedisServer
    worker: Proc
    edges: list[Proc]
    spare: Proc  # a second sim worker, in no pool at first

    @property
    def bases(self) -> list[str]:
        return [f"http://{e.address}" for e in self.edges]


@contextmanager
def fleet(replicas: int, *edge_args: str) -> Iterator[Fleet]:
    with redis_server() as redis:
        worker = start_worker("--engine", "sim", "--sim-token-delay", "0.02")
        spare = start_worker("--engine", "sim", "--sim-token-delay", "0.02")
        edges: list[Proc] = []
        try:
            args = ["--worker", worker.address, "--store-url", redis.url, "--admin-key", ADMIN]
            args += [*LIMITS, *edge_args]
            for _ in range(replicas):
                edges.append(start_edge("--processes", "2", *args, env=ENV))
            for e in edges:
                wait_ready(f"http://{e.address}")
            yield Fleet(redis, worker, edges, spare)
        finally:
            for e in edges:
                e.kill()
            worker.kill()
            spare.kill()


@pytest.fixture(scope="module")
def two() -> Iterator[Fleet]:
    with fleet(2) as f:
        yield f


def chat(max_tokens: int, stream: bool = True, **extra: object) -> dict[str, object]:
    return {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "stream": stream,
        **extra,
    }


def test_a_rate_limit_holds_across_replicas_and_processes(two):
    """20 requests/s per key: 20 +- 10% a second admitted in total over 4 processes."""
    burst = RATE  # --rate-burst 0: the rate
    duration = 3.0
    statuses: Counter[int] = Counter()
    others: list[str] = []  # the bodies of any other answers

    async def run() -> float:
        limits = httpx.Limits(max_keepalive_connections=0)  # a new connection each time
        async with httpx.AsyncClient(limits=limits, timeout=5) as client:
            t0 = time.monotonic()

            async def loop(i: int) -> None:
                while time.monotonic() - t0 < duration:
                    base = two.bases[i % 2]
                    r = await client.get(f"{base}/v1/models", headers=auth("rate"))
                    statuses[r.status_code] += 1
                    if r.status_code not in (200, 429):
                        others.append(r.text)
                    if r.status_code == 429:
                        assert float(r.headers["retry-after"]) > 0
                        assert r.json()["error"]["code"] == "rate_limit_exceeded"

            await asyncio.gather(*(loop(i) for i in range(8)))
            return time.monotonic() - t0

    elapsed = asyncio.run(run())
    assert set(statuses) == {200, 429}, (statuses, others[:3])
    expected = burst + RATE * elapsed
    assert abs(statuses[200] - expected) <= 0.1 * RATE * elapsed + 1, (statuses, elapsed)
    assert statuses[429] > statuses[200]  # the load was well above the limit


async def test_a_stream_limit_holds_across_replicas_detached_streams_included(two):
    a, b = two.bases
    h = auth("streams")  # its 4 generations of 100 tokens stay within its 600 tokens/min
    readers = []
    async with httpx.AsyncClient(timeout=10) as client, AsyncExitStack() as open_streams:
        # Two long streams on replica A, each read to its first token.
        for _ in range(2):
            resp = await open_streams.enter_async_context(
                client.stream(
                    "POST", f"{a}/v1/chat/completions", json=chat(100, ignore_eos=True), headers=h
                )
            )
            assert resp.status_code == 200
            lines = resp.aiter_lines()
            readers.append(lines)  # kept: a collected reader closes its response
            while not (await anext(lines)).startswith("data: "):
                pass
        third = await client.post(f"{b}/v1/chat/completions", json=chat(5), headers=h)
        assert (third.status_code, third.json()["error"]["code"]) == (
            429,
            "concurrency_limit_exceeded",
        )
        detached = await client.post(f"{b}/v1/streams", json=chat(100, ignore_eos=True), headers=h)
        assert detached.status_code == 429
    # Both streams left (the client went away: their slots free up); two browser streams,
    # one made on each replica, hold both slots while they run detached.
    async with httpx.AsyncClient(timeout=10) as client:
        for base in (b, a):

            async def made(base: str = base) -> bool:
                body = chat(100, ignore_eos=True)
                r = await client.post(f"{base}/v1/streams", json=body, headers=h)
                if r.status_code != 201:
                    assert r.json()["error"]["code"] == "concurrency_limit_exceeded"
                return r.status_code == 201

            await eventually_async(
                made, what=f"a browser stream made on {base}", timeout=5, interval=0.05
            )
        for base in (a, b):
            refused = await client.post(f"{base}/v1/chat/completions", json=chat(5), headers=h)
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == "concurrency_limit_exceeded"


async def test_a_tokens_per_minute_limit_refuses_by_tokens_not_requests(two):
    a, b = two.bases
    h = auth("tpm")
    async with httpx.AsyncClient(timeout=10) as client:
        body = chat(500, ignore_eos=True)  # 500 + the prompt of 600 reserved on replica A
        async with client.stream("POST", f"{a}/v1/chat/completions", json=body, headers=h) as r:
            assert r.status_code == 200
            big = await client.post(f"{b}/v1/chat/completions", json=chat(250), headers=h)
            assert big.status_code == 429
            err = big.json()["error"]
            assert (err["code"], err["type"]) == ("tokens_limit_exceeded", "tokens")
            # ~98 tokens left, refilling 10 a second: the wait is for the missing ~153.
            assert 10 <= float(big.headers["retry-after"]) <= 20
            small = chat(40, stream=False)  # the next request, small enough: admitted
            ok = await client.post(f"{b}/v1/chat/completions", json=small, headers=h)
            assert ok.status_code == 200


async def test_a_generation_settles_its_reservation_with_its_usage(two):
    a, b = two.bases
    h = auth("settle")
    async with httpx.AsyncClient(timeout=10) as client:
        # Reserves ~551 of 600; the sim answers in 48 tokens, so ~500 come back at the end.
        first = await client.post(
            f"{a}/v1/chat/completions", json=chat(550, stream=False), headers=h
        )
        assert first.status_code == 200
        assert first.json()["usage"]["completion_tokens"] < 100

        async def admitted() -> bool:
            again = await client.post(
                f"{b}/v1/chat/completions", json=chat(550, stream=False), headers=h
            )
            assert again.status_code in (200, 429)
            return again.status_code == 200

        await eventually_async(  # without the settlement: ~50 s of refill
            admitted, what="the settled tokens admit another", timeout=2, interval=0.05
        )


class Load(threading.Thread):
    """Requests to every edge in turn, new connections, until stopped; statuses by phase."""

    def __init__(self, bases: list[str], key: str) -> None:
        super().__init__(daemon=True)
        self.bases = bases
        self.key = key
        self.phase = "up"
        self.seen: dict[str, Counter[int]] = {}
        self.retry_after_missing = 0
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=5) as c:
            i = 0
            while not self.stop.is_set() and i < 5000:
                base = self.bases[i % len(self.bases)]
                phase = self.phase  # when it was sent
                r = c.post(
                    f"{base}/v1/chat/completions",
                    json=chat(2, stream=False),
                    headers=auth(self.key),
                )
                self.seen.setdefault(phase, Counter())[r.status_code] += 1
                if r.status_code in (429, 503) and "retry-after" not in r.headers:
                    self.retry_after_missing += 1
                i += 1


def wait_phase(load: Load, phase: str, count: int, timeout: float = 10) -> None:
    eventually(
        lambda: sum(load.seen.get(phase, Counter()).values()) >= count,
        what=f"{count} requests in phase {phase}",
        timeout=timeout,
    )


def streams_shared(bases: list[str], key: str) -> bool:
    """Two streams held on the first replica: is a third refused on the second? (Short
    ones: a stream the client leaves keeps its tokens-per-minute reservation.)"""
    with httpx.Client(timeout=10) as c:
        held = []
        try:
            for _ in range(2):
                r = c.send(
                    c.build_request(
                        "POST",
                        f"{bases[0]}/v1/chat/completions",
                        json=chat(30, ignore_eos=True),
                        headers=auth(key),
                    ),
                    stream=True,
                )
                held.append(r)
                if r.status_code != 200:
                    return False
            third = c.post(
                f"{bases[1]}/v1/chat/completions", json=chat(2, stream=False), headers=auth(key)
            )
            return third.json().get("error", {}).get("code") == "concurrency_limit_exceeded"
        finally:
            for r in held:
                r.close()


def test_redis_stopped_mid_load_fails_open_then_limits_hold_again(two):
    load = Load(two.bases, "down")
    load.start()
    try:
        wait_phase(load, "up", 20)
        two.redis.stop()
        load.phase = "down"
        wait_phase(load, "down", 40)
        load.phase = "back"
        two.redis.start()
        t_up = time.monotonic()
    finally:
        load.stop.set()
        load.join(30)
    while True:  # fleet-wide again: a check started within 2 s of the restart finds it
        started = time.monotonic() - t_up
        if streams_shared(two.bases, "down"):
            break
        assert started < 2.0, "limits not shared again within 2 s"
    statuses = {s for c in load.seen.values() for s in c}
    assert statuses <= {200, 429}, load.seen  # never a 5xx
    assert load.seen["down"][200] > 0  # open: admitted by local limits meanwhile
    assert load.retry_after_missing == 0

    # The canary judges fell back to each process's own windows, then came back.
    def logs() -> str:
        return "".join(e.log() for e in two.edges)

    eventually(
        lambda: "judging by the fleet's windows" in logs(),
        what="the canary judges on the fleet's windows again",
        timeout=2,
        interval=0.05,
    )
    assert "judging by this process's windows" in logs()


def test_redis_stopped_fails_closed_with_503_then_recovers():
    with fleet(1, "--store-failure", "closed") as f:
        load = Load(f.bases, "closed")
        load.start()
        try:
            wait_phase(load, "up", 10)
            f.redis.stop()
            load.phase = "down"
            wait_phase(load, "down", 20)
            load.phase = "back"
            f.redis.start()
            eventually(  # an empty Redis: the lease sets settle first (RECOVER_S)
                lambda: load.seen.get("back", Counter())[200],
                what="admitting again",
                timeout=2 + RECOVER_S,
            )
        finally:
            load.stop.set()
            load.join(30)
        statuses = {s for c in load.seen.values() for s in c}
        assert statuses <= {200, 429, 503}, load.seen  # never a 500
        assert load.seen["down"][503] > 0 and load.seen["down"][200] == 0, load.seen
        assert load.retry_after_missing == 0


def pool_of(base: str, session: str = "") -> str:
    """The pool a chat request (of `session`, else a new one) was served from."""
    headers = {**auth("control"), **({"x-session-id": session} if session else {})}
    with httpx.Client(timeout=5) as c:  # its own connection: any process of the replica
        r = c.post(f"{base}/v1/chat/completions", json=chat(2, stream=False), headers=headers)
    assert r.status_code == 200, r.text
    return r.headers["x-sluice-pool"]


def test_an_admin_change_on_one_replica_steers_the_others_within_a_second(two):
    a, b = two.bases
    admin = {"authorization": f"Bearer {ADMIN}"}
    assert pool_of(b, "pinned-session") == "default"  # pinned in Redis by replica B
    with httpx.Client(timeout=5, headers=admin) as c:
        spec = {"name": "v2", "version": "2", "weight": 0, "workers": [two.spare.address]}
        assert c.post(f"{a}/admin/pools", json=spec).status_code == 201
        eventually(
            lambda: (
                c.get(f"{b}/readyz").is_success
                and any(
                    w["status"] == "SERVING"
                    for p in c.get(f"{b}/admin/pools").json()["pools"]
                    if p["name"] == "v2"
                    for w in p["workers"]
                )
            ),
            what="the new pool reached replica B, its worker SERVING",
        )
        assert c.put(f"{a}/admin/pools/default/weight", json={"weight": 0}).status_code == 200
        t0 = time.monotonic()
        assert c.put(f"{a}/admin/pools/v2/weight", json={"weight": 1}).status_code == 200
    streak = 0  # new sessions on B, each on a new connection (either process)
    while streak < 6:
        streak = streak + 1 if pool_of(b) == "v2" else 0
        assert time.monotonic() - t0 < 1.0 or streak, "replica B not steered within 1 s"
        assert time.monotonic() - t0 < 3.0
    # A pinned session keeps its pool on every replica (its pin is in Redis).
    assert pool_of(a, "pinned-session") == "default"
    # A replica started now reads the fleet's state at start-up.
    late = start_edge(
        "--worker", two.worker.address, "--store-url", two.redis.url, "--admin-key", ADMIN,
        env=ENV,
    )  # fmt: skip
    try:
        base = f"http://{late.address}"
        wait_ready(base)
        with httpx.Client(timeout=5, headers=admin) as c:
            pools = {p["name"]: p["weight"] for p in c.get(f"{base}/admin/pools").json()["pools"]}
        assert pools == {"default": 0, "v2": 1}
    finally:
        late.kill()


def requests_counted(base: str) -> float:
    text = httpx.get(f"{base}/metrics", headers={"authorization": f"Bearer {ADMIN}"}).text
    head = 'sluice_edge_requests_total{route="/health",status="200"} '
    return sum(float(line[len(head) :]) for line in text.splitlines() if line.startswith(head))


def test_metrics_of_a_replica_add_up_over_its_processes(two):
    a = two.bases[0]
    before = requests_counted(a)
    with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=5) as c:
        for _ in range(12):  # new connections: both processes take some
            assert c.get(f"{a}/health").status_code == 200  # a route no other test calls
    eventually(  # the other process writes its figures every 0.5 s
        lambda: requests_counted(a) >= before + 12,
        what="both processes' requests counted",
        timeout=3,
        interval=0.05,
    )
    assert requests_counted(a) == before + 12


def pools_seen(base: str) -> list[dict[str, object]]:
    """Pool `broken` as 6 requests on new connections saw it (both processes)."""
    admin = {"authorization": f"Bearer {ADMIN}"}
    seen = []
    with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=5) as c:
        for _ in range(6):
            pools = c.get(f"{base}/admin/pools", headers=admin).json()["pools"]
            seen.append(next(p for p in pools if p["name"] == "broken"))
    return seen


def test_a_canary_rolled_back_by_one_process_drops_to_0_on_every_replica(two):
    """Only replica A's one connection sees the failures; every process drains it."""
    a, b = two.bases
    tiny = start_worker("--engine", "sim", "--max-model-len", "24")  # every long prompt: 400
    admin = {"authorization": f"Bearer {ADMIN}"}
    long_prompt = {"messages": [{"role": "user", "content": "word " * 40}], "max_tokens": 2}
    try:
        spec = {
            "name": "broken",
            "weight": 2,
            "workers": [tiny.address],
            "rollback": {"max_error_rate": 0.3, "window_s": 30, "min_requests": 8},
        }
        with httpx.Client(timeout=5) as c:  # one connection: one process of replica A
            assert c.post(f"{a}/admin/pools", json=spec, headers=admin).status_code == 201
            eventually(
                lambda: any(
                    w["status"] == "SERVING"
                    for p in c.get(f"{a}/admin/pools", headers=admin).json()["pools"]
                    if p["name"] == "broken"
                    for w in p["workers"]
                ),
                what="the canary's worker SERVING",
            )
            deadline = time.monotonic() + 20
            codes: Counter[int] = Counter()
            while True:
                pool = next(
                    p
                    for p in c.get(f"{a}/admin/pools", headers=admin).json()["pools"]
                    if p["name"] == "broken"
                )
                if pool["weight"] == 0:
                    break
                assert time.monotonic() < deadline, ("no rollback", codes, pool)
                new_session = {**auth("canary"), "x-session-id": f"s{sum(codes.values())}"}
                c.cookies.clear()  # a new session each time: placed by the weights
                r = c.post(f"{a}/v1/chat/completions", json=long_prompt, headers=new_session)
                codes[r.status_code] += 1
                assert r.status_code in (200, 400, 429), r.text
                if r.status_code == 429:  # the key's rate: wait as the server says
                    time.sleep(float(r.headers["retry-after"]))  # a client's behaviour
            t0 = time.monotonic()
        while True:
            seen = [p for base in (a, b) for p in pools_seen(base)]
            if all(p["weight"] == 0 for p in seen):
                break
            assert time.monotonic() - t0 < 1.0, seen
        assert {p["draining"] for p in seen} == {"rolled_back"}
    finally:
        with httpx.Client(timeout=5) as c:
            c.delete(f"{a}/admin/pools/broken", headers=admin)
        tiny.kill()


def every_process(base: str, name: str) -> list[dict[str, object]]:
    """Pool `name` as 6 requests on new connections saw it (both processes), or {}."""
    admin = {"authorization": f"Bearer {ADMIN}"}
    seen = []
    with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=5) as c:
        for _ in range(6):
            pools = c.get(f"{base}/admin/pools", headers=admin).json()["pools"]
            seen.append(next((p for p in pools if p["name"] == name), {}))
    return seen


def wait_everywhere(two: Fleet, name: str, ok: Callable[[dict], bool], limit: float) -> list:
    """Pool `name` as every process of both replicas sees it, once `ok` for all."""

    def seen() -> list:
        pools = [p for base in two.bases for p in every_process(base, name)]
        return pools if all(ok(p) for p in pools) else []

    def brief() -> list:
        pools = [p for base in two.bases for p in every_process(base, name)]
        return [{k: p.get(k) for k in ("weight", "window", "fleet_window")} for p in pools]

    return eventually(seen, what=f"pool {name} as wanted everywhere", timeout=limit, detail=brief)


def serving(p: dict) -> bool:
    return bool(p) and all(w["status"] == "SERVING" for w in p["workers"])


def spread(two: Fleet, prompts: list[str]) -> list[int]:
    """One chat request per prompt, each a new session on a new connection, replicas in
    turn (either process of each takes it): the statuses."""
    statuses = []
    with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=5) as c:
        for i, prompt in enumerate(prompts):
            body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 2}
            headers = {**auth("summed"), "x-session-id": f"summed-{time.time()}-{i}"}
            r = c.post(f"{two.bases[i % 2]}/v1/chat/completions", json=body, headers=headers)
            statuses.append(r.status_code)
    return statuses


def test_a_canary_failing_across_the_fleet_is_rolled_back_by_the_summed_window(two):
    """12 attempts on the canary, 6 to each replica: no process sees the 12 its judge
    needs (min_requests), only the fleet's window does. Then a healthy canary with the
    same traffic stays. (Without the summed window nothing is ever rolled back here.)"""
    a = two.bases[0]
    admin = {"authorization": f"Bearer {ADMIN}"}
    tiny = start_worker("--engine", "sim", "--max-model-len", "24")  # a long prompt: 400
    bounds = {"max_error_rate": 0.3, "window_s": 60, "min_requests": 12}
    with httpx.Client(timeout=5, headers=admin) as c:
        before = {p["name"]: p["weight"] for p in c.get(f"{a}/admin/pools").json()["pools"]}
    try:
        with httpx.Client(timeout=5, headers=admin) as c:
            for name in before:  # the canary takes every new session
                assert c.put(f"{a}/admin/pools/{name}/weight", json={"weight": 0}).is_success
            spec = {"name": "flaky", "weight": 1, "workers": [tiny.address], "rollback": bounds}
            assert c.post(f"{a}/admin/pools", json=spec).status_code == 201
        wait_everywhere(two, "flaky", serving, 10)
        long, short = "word " * 40, "hi"
        prompts = [long, long, short] * 4  # 8 of 12 fail: 67 % > 30 %
        assert spread(two, prompts) == [400 if p == long else 200 for p in prompts]
        t0 = time.monotonic()
        seen = wait_everywhere(two, "flaky", lambda p: p["weight"] == 0, 3.0)
        took = time.monotonic() - t0
        assert {p["draining"] for p in seen} == {"rolled_back"}
        # Decided once: every process shows the one rollback that was published.
        (rolled,) = {orjson.dumps(p["rolled_back"]) for p in seen}
        assert "error rate 66.7% over 12 requests" in orjson.loads(rolled)["reason"]
        assert took < 3.0
        with httpx.Client(timeout=5, headers=admin) as c:
            assert c.delete(f"{a}/admin/pools/flaky").status_code == 204
            spec = {"name": "steady", "weight": 1, "workers": [tiny.address], "rollback": bounds}
            assert c.post(f"{a}/admin/pools", json=spec).status_code == 201
        wait_everywhere(two, "steady", serving, 10)
        assert spread(two, [short] * 12) == [200] * 12

        def judged_healthy(p: dict) -> bool:
            window = p["fleet_window"]
            return window is not None and (window["requests"], window["errors"]) == (12, 0)

        seen = wait_everywhere(two, "steady", judged_healthy, 3.0)
        assert {(p["weight"], p["draining"], p["rolled_back"]) for p in seen} == {(1, None, None)}
    finally:
        with httpx.Client(timeout=5, headers=admin) as c:
            for name in ("flaky", "steady"):
                c.delete(f"{a}/admin/pools/{name}")
            for name, weight in before.items():
                c.put(f"{a}/admin/pools/{name}/weight", json={"weight": weight})
        tiny.kill()


class Traffic(threading.Thread):
    """New sessions on new connections to the replicas in turn, until stopped."""

    def __init__(self, bases: list[str]) -> None:
        super().__init__(daemon=True)
        self.bases = bases
        self.statuses: Counter[int] = Counter()
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=5) as c:
            i = 0
            while not self.stop.is_set() and i < 5000:
                headers = {**auth(f"ro{i % 4}"), "x-session-id": f"ro-{time.time()}-{i}"}
                r = c.post(
                    f"{self.bases[i % 2]}/v1/chat/completions",
                    json=chat(2, stream=False),
                    headers=headers,
                )
                self.statuses[r.status_code] += 1
                i += 1


def weights_everywhere(bases: list[str], names: tuple[str, ...]) -> list[tuple]:
    """Each pool of `names` as (weight, draining), from both processes of every base."""
    admin = {"authorization": f"Bearer {ADMIN}"}
    seen = []
    with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=5) as c:
        for base in bases:
            for _ in range(6):
                pools = {
                    p["name"]: p
                    for p in c.get(f"{base}/admin/pools", headers=admin).json()["pools"]
                }
                seen.append(tuple((pools[n]["weight"], pools[n]["draining"]) for n in names))
    return seen


def wait_weights(bases: list[str], names: tuple[str, ...], want: tuple, limit: float) -> None:
    eventually(
        lambda: all(s == want for s in weights_everywhere(bases, names)),
        what=f"weights {want} everywhere",
        timeout=limit,
        detail=lambda: weights_everywhere(bases, names),
    )


def rollout_everywhere(bases: list[str], path: str) -> list[dict]:
    admin = {"authorization": f"Bearer {ADMIN}"}
    with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=5) as c:
        return [
            c.get(f"{b}/admin/rollouts{path}", headers=admin).json()
            for b in bases
            for _ in range(4)
        ]


def test_a_rollout_started_on_one_replica_drives_the_fleet_and_stops_everywhere_on_abort(two):
    """Started through replica A, run by one process of the four; replica B's weights
    follow each step within a second; aborted through B: rolled back everywhere."""
    a, b = two.bases
    admin = {"authorization": f"Bearer {ADMIN}"}
    workers = [start_worker("--engine", "sim", "--sim-token-delay", "0.002") for _ in range(2)]
    with httpx.Client(timeout=5, headers=admin) as c:
        before = {p["name"]: p["weight"] for p in c.get(f"{a}/admin/pools").json()["pools"]}
    names = ("ro-stable", "ro-canary")
    traffic = Traffic(two.bases)
    try:
        with httpx.Client(timeout=5, headers=admin) as c:
            for name in before:
                assert c.put(f"{a}/admin/pools/{name}/weight", json={"weight": 0}).is_success
            for name, weight, w in zip(names, (1, 0), workers, strict=True):
                spec = {"name": name, "weight": weight, "workers": [w.address]}
                assert c.post(f"{a}/admin/pools", json=spec).status_code == 201
        for name in names:
            wait_everywhere(two, name, serving, 10)
        traffic.start()
        plan = {
            "canary": "ro-canary",
            "stable": "ro-stable",
            "steps": [20, 50, 100],
            "hold_s": [3, 3, 600],
            "analysis": {"min_samples": 2, "max_ttft_p99_ratio": None, "max_itl_p99_ratio": None},
        }
        with httpx.Client(timeout=5, headers=admin) as c:
            started = c.post(f"{a}/admin/rollouts", json=plan)
            assert started.status_code == 201, started.text
            rid = started.json()["id"]
            again = c.post(f"{b}/admin/rollouts", json=plan)  # one at a time, fleet-wide
            assert (again.status_code, again.json()["error"]["code"]) == (409, "conflict")
            for step, pct in enumerate(plan["steps"]):
                eventually(
                    lambda s=step: c.get(f"{a}/admin/rollouts/{rid}").json()["step"] == s,
                    what=f"step {step}",
                    timeout=20,
                )
                wait_weights([b], names, ((100 - pct, None), (pct, None)), 1.0)
            aborted = c.post(f"{b}/admin/rollouts/{rid}/abort")
            assert aborted.status_code == 200 and aborted.json()["state"] == "aborted"
        wait_weights(two.bases, names, ((1, None), (0, "rolled_back")), 1.0)
        seen = rollout_everywhere(two.bases, f"/{rid}")
        assert all(r == seen[0] for r in seen), seen  # every process answers the same
        events = [(e["event"], e["step"]) for e in seen[0]["history"]]
        assert events == [("started", 0), ("advanced", 0), ("advanced", 1), ("aborted", 2)]
        eventually(  # the owner lets the lease go at its next check
            lambda: (
                {(x["active"], x["owner"]) for x in rollout_everywhere(two.bases, "")}
                == {(None, None)}
            ),
            what="no active rollout, no owner, everywhere",
            timeout=1.0,
            detail=lambda: rollout_everywhere(two.bases, ""),
        )
    finally:
        traffic.stop.set()
        traffic.join(30)
        with httpx.Client(timeout=5, headers=admin) as c:
            for name in names:
                c.delete(f"{a}/admin/pools/{name}")
            for name, weight in before.items():
                c.put(f"{a}/admin/pools/{name}/weight", json={"weight": weight})
        for w in workers:
            w.kill()
    assert set(traffic.statuses) <= {200, 429}, traffic.statuses
    assert traffic.statuses[200] > 0
