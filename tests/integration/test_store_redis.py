"""The shared store against a real redis-server: atomic buckets and leases across
clients (each client stands for an edge process), a generation's two combined steps
(`admit`, `finish`: the same contract in memory and in Redis), pins, the failure modes
with the server stopped and started again, and the store calls the limits make per
request."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest

from edge.config import RoutingConfig
from edge.obs.metrics import Metrics
from edge.obs.record import ObsMiddleware, record_of
from edge.release.windows import FleetWindows
from edge.routing.pools import PoolSpec
from edge.routing.registry import PoolRegistry
from edge.security.limits import Limits, LimitsMiddleware
from edge.store.base import StoreUnavailable
from edge.store.control import Control
from edge.store.guarded import Guarded
from edge.store.memory import MemoryStore
from edge.store.redis import RedisStore
from edge.store.windows import WindowCounters
from edge.upstream.channel import ChannelFactory
from tests.redis_proc import RedisServer, redis_server
from tests.waits import eventually_async


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with redis_server() as srv:
        yield srv


def clients(server: RedisServer, n: int, prefix: str) -> list[RedisStore]:
    return [RedisStore(server.url, 1.0, prefix) for _ in range(n)]


async def close(*stores: RedisStore) -> None:
    for s in stores:
        await s.close()


async def test_a_bucket_admits_its_burst_then_the_rate_across_processes(server, request):
    a, b = clients(server, 2, request.node.name)
    try:
        # 40 takes at once from two "processes" on a 10-deep bucket: exactly 10 pass.
        waits = await asyncio.gather(
            *(s.take("rate:k", 5.0, 10.0) for s in (a, b) for _ in range(20))
        )
        assert sum(w == 0 for w in waits) == 10
        refused = [w for w in waits if w > 0]
        assert len(refused) == 30 and all(0 < w <= 0.2 + 1e-6 for w in refused)
        # Another key has its own bucket.
        assert await b.take("rate:other", 5.0, 10.0) == 0
    finally:
        await close(a, b)


async def test_a_bucket_refills_at_its_rate_on_the_servers_clock(server, request):
    (a,) = clients(server, 1, request.node.name)
    try:
        assert await a.take("k", 20.0, 1.0) == 0
        wait = await a.take("k", 20.0, 1.0)
        assert 0 < wait <= 0.05

        async def refilled() -> bool:
            return await a.take("k", 20.0, 1.0) == 0

        # Within its wait, give or take.
        await eventually_async(refilled, what="the bucket refilled", timeout=2)
    finally:
        await close(a)


async def test_token_costs_reserve_and_settle_with_debt(server, request):
    (a,) = clients(server, 1, request.node.name)
    try:
        rate, burst = 100 / 60, 100.0  # 100 tokens a minute
        assert await a.take("tpm", rate, burst, 80) == 0  # reserve 80
        wait = await a.take("tpm", rate, burst, 30)  # 20 left: refused by tokens
        assert wait == pytest.approx(10 / rate, rel=0.05)
        assert await a.take("tpm", rate, burst, -70, force=True) == 0  # used 10: 70 back
        assert await a.take("tpm", rate, burst, 30) == 0  # 90 left
        assert await a.take("tpm", rate, burst, 200, force=True) == 0  # used beyond: debt
        wait = await a.take("tpm", rate, burst, 1)
        assert wait == pytest.approx(141 / rate, rel=0.05)  # 60 - 200 = -140 owed
    finally:
        await close(a)


async def test_leases_hold_a_limit_across_processes_and_free_on_release(server, request):
    a, b = clients(server, 2, request.node.name)
    try:
        tries = [(s, f"{i}{j}") for i, s in enumerate((a, b)) for j in "xyz"]
        got = await asyncio.gather(*(s.acquire("streams:k", lease, 3, 30) for s, lease in tries))
        assert sorted(got) == [False, False, False, True, True, True]
        assert await a.acquire("streams:k", "again", 3, 30) is False
        holder, lease = next(t for t, ok in zip(tries, got, strict=True) if ok)
        await holder.release("streams:k", lease)
        assert await b.acquire("streams:k", "again", 3, 30) is True
        assert await a.acquire("streams:k", "again", 3, 30) is True  # the same lease: held
    finally:
        await close(a, b)


async def test_a_held_lease_is_renewed_and_a_dead_holders_lapses(server, request):
    holder, other = clients(server, 2, request.node.name)
    try:
        assert await holder.acquire("s", "mine", 1, 0.3)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.0:  # three ttls: renewed every 0.1 s meanwhile
            assert await other.acquire("s", "theirs", 1, 0.3) is False
            await asyncio.sleep(0.05)  # held for a duration: the property under test
        await holder.close()  # the holder dies without releasing: nobody renews it
        await eventually_async(
            lambda: other.acquire("s", "theirs", 1, 0.3),
            what="a dead holder's lease lapsed",
            timeout=2,
        )
    finally:
        await close(other)


@contextlib.asynccontextmanager
async def two_processes(kind: str, server: RedisServer, prefix: str) -> AsyncIterator[list]:
    """Two stores sharing their state: one MemoryStore seen twice (two tasks of one
    process), or two Redis clients (two processes)."""
    if kind == "memory":
        store = MemoryStore(60, 100)
        yield [store, store]
        return
    stores = clients(server, 2, prefix)
    try:
        yield stores
    finally:
        await close(*stores)


KINDS = pytest.mark.parametrize("kind", ["memory", "redis"])


@KINDS
async def test_admit_takes_the_token_then_the_slot_and_a_full_set_keeps_the_token_spent(
    kind, server, request
):
    async with two_processes(kind, server, request.node.name) as (a, b):
        rate, burst = 0.01, 3.0  # 3 tokens, then one per 100 s
        assert await a.admit("r", rate, burst, "s", "x", 1, 30) == (0.0, True)
        assert await b.admit("r", rate, burst, "s", "y", 1, 30) == (0.0, False)  # slots full
        await a.release("s", "x")
        assert await b.admit("r", rate, burst, "s", "z", 1, 30) == (0.0, True)  # 3rd token
        # y's refusal spent its token (as a take then an acquire would): no 4th one.
        wait, held = await a.admit("r", rate, burst, "s", "w", 1, 30)
        assert not held and wait == pytest.approx(1 / rate, rel=0.01)  # the Retry-After
        await b.release("s", "z")
        wait, held = await a.admit("r", rate, burst, "s", "v", 1, 30)
        assert wait > 0 and not held
        # Refused by the rate: no lease was tried, the set is empty.
        assert await b.acquire("s", "u", 1, 30) is True
        assert await a.acquire("s", "v", 1, 30) is False


@KINDS
async def test_admit_is_one_atomic_step_across_processes(kind, server, request):
    async with two_processes(kind, server, request.node.name) as (a, b):
        tries = [(s, f"{i}-{j}") for i, s in enumerate((a, b)) for j in range(20)]
        got = await asyncio.gather(
            *(s.admit("rate:k", 5.0, 10.0, "streams:k", lease, 4, 30) for s, lease in tries)
        )
        assert sum(wait == 0 for wait, _ in got) == 10  # the burst, exactly
        assert sum(held for _, held in got) == 4  # the slots, exactly
        assert all(not held for wait, held in got if wait > 0)
        assert await a.acquire("streams:k", "another", 4, 30) is False


@KINDS
async def test_finish_releases_the_slot_and_settles_the_tokens_in_one_step(kind, server, request):
    async with two_processes(kind, server, request.node.name) as (a, b):
        rate, burst = 100 / 60, 100.0  # 100 tokens a minute
        assert await a.acquire("s", "x", 1, 30)
        assert await a.take("tpm", rate, burst, 80) == 0  # reserve 80
        await a.finish("s", "x", "tpm", rate, burst, -70)  # used 10: 70 back
        if kind == "redis":
            assert ("s", "x") not in a.held  # no longer renewed
        assert await b.acquire("s", "y", 1, 30) is True  # the slot is free
        assert await b.take("tpm", rate, burst, 90) == 0  # 20 + 70
        assert await b.take("tpm", rate, burst, 1) > 0
        await b.finish("s", "y", "tpm", rate, burst, 50)  # used 50 beyond: a debt
        assert await a.acquire("s", "z", 1, 30) is True
        assert await a.take("tpm", rate, burst, 1) == pytest.approx(51 / rate, rel=0.05)
        await a.finish("s", "not-held", "tpm", rate, burst, 0)  # an unknown lease: nothing
        assert await b.acquire("s", "w", 1, 30) is False


@pytest.mark.parametrize("fail_open", [True, False], ids=["open", "closed"])
async def test_admit_and_finish_fail_by_mode_and_recover(fail_open, request):
    with redis_server() as srv:
        shared = RedisStore(srv.url, 0.25, request.node.name)
        store = Guarded(shared, MemoryStore(60, 100), fail_open=fail_open, retry_s=0.2)
        tpm = (1.0, 100.0)
        try:
            assert await store.admit("r", 1.0, 5.0, "s", "a", 1, 30) == (0.0, True)
            assert await store.take("tpm", *tpm, 50) == 0
            srv.stop()
            t0 = time.monotonic()
            # A Redis lease finished while Redis fails: no error; the lease lapses by its
            # ttl, the settlement goes to this process's bucket.
            await store.finish("s", "a", "tpm", *tpm, -50)
            assert not store.up and (store.failures, store.fallbacks) == (1, 1)
            if fail_open:  # this process's own buckets and slots
                assert await store.admit("r", 1.0, 5.0, "s", "b", 1, 30) == (0.0, True)
                assert await store.admit("r", 1.0, 5.0, "s", "c", 1, 30) == (0.0, False)
                assert store.local.held("s") == 1
                await store.finish("s", "b", "tpm", *tpm, 5)  # released where it was taken
                assert store.local.held("s") == 0
                assert await store.take("tpm", *tpm, 96) > 0  # 100 - 5 left locally
            else:
                with pytest.raises(StoreUnavailable) as err:
                    await store.admit("r", 1.0, 5.0, "s", "b", 1, 30)
                assert 0 < err.value.retry_after_s <= 0.2
                await store.finish("s", "b", "tpm", *tpm, 5)  # nothing to refuse
            assert time.monotonic() - t0 < 1.0  # no hang

            srv.start()  # an empty Redis on the same port
            leases = (f"z{n}" for n in range(1000))  # a new lease each try
            lease = ""

            async def admitted_by_redis() -> bool:
                nonlocal lease
                before, lease = store.fallbacks, next(leases)
                with contextlib.suppress(StoreUnavailable):  # closed, until its retry
                    got = await store.admit("r2", 0.001, 100.0, "s2", lease, 1, 30)
                    if store.fallbacks == before:
                        return got == (0.0, True)
                    if got[1]:  # admitted here meanwhile (Redis gets it once it answers):
                        await store.finish("s2", lease, "tpm", *tpm, 0)  # that stream ends
                return False

            await eventually_async(  # after the leases settle (RECOVER_S)
                admitted_by_redis, what="admitted by Redis again", timeout=5.0, interval=0.05
            )
            check = RedisStore(srv.url, 1.0, request.node.name)
            try:
                assert await check.acquire("s2", "other", 1, 30) is False  # it is in Redis
                await store.finish("s2", lease, "tpm", *tpm, 1)
                assert await check.acquire("s2", "other", 1, 30) is True
            finally:
                await check.close()
        finally:
            await store.close()


async def ok_app(scope, receive, send) -> None:
    """A generation: reserves its tokens when a limit asks, uses 10, answers 200."""
    rec = record_of(scope)
    if rec.reserve is not None:
        await rec.reserve(100)
    rec.prompt_tokens, rec.completion_tokens = 3, 7
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def store_calls(
    store: RedisStore, limits: Limits, callers: Sequence[str]
) -> tuple[list[str], list[int]]:
    """Each caller's generation through the limits (their last byte sent, their releases
    and settlements done): the commands they sent Redis, oldest first (scripts by name),
    and their statuses."""
    rejections: defaultdict[str, int] = defaultdict(int)
    mw = LimitsMiddleware(ok_app, limits, store, rejections)  # type: ignore[arg-type]
    statuses = []
    for caller in callers:

        async def as_caller(scope, receive, send, caller=caller) -> None:
            record_of(scope).caller = caller  # what authentication sets
            await mw(scope, receive, send)

        app = ObsMiddleware(as_caller, Metrics(), ["/v1/chat/completions"], access_log=False)
        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions"}
        sent = []

        async def send(message, sent=sent) -> None:
            sent.append(message)

        await app(scope, None, send)  # type: ignore[arg-type]
        statuses.append(sent[0]["status"])
        if mw._tasks:  # releases and settlements run after the last byte
            await asyncio.wait(set(mw._tasks), timeout=2)
        assert not mw._tasks
    names = {s.sha: n for n, s in (("take", store._take), ("acquire", store._acquire))}
    names |= {store._admit.sha: "admit", store._finish.sha: "finish"}
    # Entries: id, time, duration, args, client address ("?:0" inside a script), name.
    log = await store.client.execute_command("SLOWLOG", "GET", "1000")
    ours = [e[3] for e in reversed(log) if e[4] != "?:0" and f"{store.prefix}:" in str(e[3])]
    calls = [f"{c[0]} {names.get(c[1], c[1])}" if c[0] == "EVALSHA" else c[0] for c in ours]
    return calls, statuses


@pytest.mark.parametrize(
    "limits, calls",
    [
        (Limits(10.0, 10, 2, 1000), ["EVALSHA admit", "EVALSHA take", "EVALSHA finish"]),
        (Limits(10.0, 10, 0, 0), ["EVALSHA take"]),
        (Limits(0, 0, 2, 0), ["EVALSHA acquire", "ZREM"]),
        (Limits(0, 0, 0, 1000), ["EVALSHA take", "EVALSHA take"]),
        (Limits(10.0, 10, 2, 0), ["EVALSHA admit", "ZREM"]),
        (Limits(), []),
    ],
    ids=["every-limit", "rate", "streams", "tpm", "rate-streams", "none"],
)
async def test_a_generation_makes_one_store_call_at_each_end(limits, calls, server, request):
    store = RedisStore(server.url, 1.0, request.node.name)
    try:
        await store_calls(store, limits, ["warm"])  # scripts loaded (no NOSCRIPT retry)
        await store.client.config_set("slowlog-log-slower-than", 0)
        await store.client.config_set("slowlog-max-len", 1000)
        await store.client.slowlog_reset()
        assert await store_calls(store, limits, ["k"]) == (calls, [200])
        if limits.tpm:  # settled: 100 reserved, 10 used; a minute's 1000 less 10
            assert await store.take("tpm:k", 1000 / 60, 1000.0, 990) == 0
            assert await store.take("tpm:k", 1000 / 60, 1000.0, 1) > 0
        if limits.max_streams:  # the slot is free again
            assert not await store.client.exists(store.key("leases", "streams:k"))
    finally:
        await store.client.config_set("slowlog-log-slower-than", 10000)
        await store.close()


async def test_a_refused_slot_is_one_call_and_spends_the_rate_token(server, request):
    store = RedisStore(server.url, 1.0, request.node.name)
    try:
        await store_calls(store, Limits(0.01, 2, 1, 0), ["warm"])
        assert await store.acquire("streams:k", "elsewhere", 1, 30)  # k's only slot
        await store.client.config_set("slowlog-log-slower-than", 0)
        await store.client.slowlog_reset()
        got = await store_calls(store, Limits(0.01, 2, 1, 0), ["k"])
        assert got == (["EVALSHA admit"], [429])  # concurrency_limit_exceeded
        assert await store.take("rate:k", 0.01, 2.0) == 0  # the 2nd token
        assert await store.take("rate:k", 0.01, 2.0) > 0  # the refusal spent the 1st
    finally:
        await store.client.config_set("slowlog-log-slower-than", 10000)
        await store.close()


async def test_pins_live_from_their_last_use(server, request):
    a, b = clients(server, 2, request.node.name)
    try:
        assert await a.get_pin("sess", 10) is None
        await a.put_pin("sess", "canary", 10)
        assert await b.get_pin("sess", 10) == "canary"
        await a.put_pin("short", "stable", 0.2)

        async def gone() -> bool:
            return await b.get_pin("short", 0.2) is None

        await eventually_async(
            gone,
            what="the pin lapsed",
            timeout=2,
            interval=0.3,  # longer than its ttl: no get renews it in between
        )
    finally:
        await close(a, b)


@pytest.mark.parametrize("fail_open", [True, False], ids=["open", "closed"])
async def test_a_stopped_redis_fails_by_mode_and_recovers_without_restart(fail_open, request):
    with redis_server() as srv:
        shared = RedisStore(srv.url, 0.25, request.node.name)
        store = Guarded(shared, MemoryStore(60, 100), fail_open=fail_open, retry_s=0.2)
        try:
            assert await store.take("k", 1.0, 2.0) == 0
            assert await store.acquire("s", "a", 1, 30)
            srv.stop()
            t0 = time.monotonic()
            if fail_open:  # local limits: a fresh local bucket, slots less those held
                assert [await store.take("k", 1.0, 2.0) for _ in range(3)][:2] == [0, 0]
                assert await store.acquire("s", "b", 2, 30) is True  # "a" runs on
                assert await store.acquire("s", "c", 2, 30) is False
                await store.release("s", "b")  # released where it was taken
                assert store.local.held("s") == 0
            else:
                with pytest.raises(StoreUnavailable) as err:
                    await store.take("k", 1.0, 2.0)
                assert 0 < err.value.retry_after_s <= 0.2
                with pytest.raises(StoreUnavailable):
                    await store.acquire("s", "b", 1, 30)
            assert time.monotonic() - t0 < 1.0  # no hang: refused connections fail at once
            assert not store.up and store.failures >= 1
            # Pins fall back to this process in both modes.
            await store.put_pin("p", "stable", 60)
            assert await store.get_pin("p", 60) == "stable"

            srv.start()  # an empty Redis on the same port

            async def shared_again() -> bool:  # the shared bucket is back: burst 2, then refused
                before = store.fallbacks
                try:
                    waits = [await store.take("k2", 0.001, 2.0) for _ in range(3)]
                except StoreUnavailable:  # closed, until its retry
                    return False
                return store.fallbacks == before and waits[:2] == [0, 0] and waits[2] > 0

            await eventually_async(
                shared_again, what="limits shared again", timeout=2.0, interval=0.05
            )
            check = RedisStore(srv.url, 1.0, request.node.name)
            assert await check.take("k2", 0.001, 2.0) > 0  # it is Redis's bucket
            await check.close()
        finally:
            await store.close()


def registry_of(*pools: str) -> PoolRegistry:
    specs = [PoolSpec(p, "1", 1.0, []) for p in pools]
    return PoolRegistry(specs, RoutingConfig(), ChannelFactory([], None, ""))


class Clock:
    """A monotonic clock the test moves (the wall clock is it plus a fixed offset), ahead
    of the real one (pools' windows start at their creation)."""

    def __init__(self) -> None:
        self.t = float(int(time.monotonic()) + 100)  # whole seconds on the wall too

    def mono(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.t + 1.7e9


async def test_canary_windows_sum_over_processes_and_fall_back_to_local_without_redis(request):
    with redis_server() as srv:
        clock = Clock()
        regs = [registry_of("canary", "stable") for _ in range(3)]  # three edge processes
        windows = [
            FleetWindows(r, WindowCounters(srv.url, 0.25, request.node.name), lambda: 30.0,
                         wall=clock.wall, mono=clock.mono)
            for r in regs
        ]  # fmt: skip
        try:
            for i, reg in enumerate(regs):  # 4 outcomes each, over two seconds
                for k in range(4):
                    code = "upstream_error" if k == i else "ok"
                    reg.pool_metrics("canary").outcome(code, 0.1, now=clock.t + k * 0.5)
                reg.pool_metrics("stable").outcome("ok", 0.1, now=clock.t)
            clock.t += 2.0
            for w in windows:
                await w.exchange()  # adds its own
            await windows[0].exchange()  # reads what the others added after it
            got = windows[0].window("canary", 30.0, clock.t)
            assert (got.requests, got.errors) == (12, 3)
            assert got.ttft_p99_s == pytest.approx(0.1, rel=0.025)
            assert windows[0].window("stable", 30.0, clock.t).requests == 3
            # Outcomes in two seconds (at 0, 0.5, 1, 1.5 s): 1 s back takes the second.
            assert windows[0].window("canary", 1.0, clock.t).requests == 6
            mine = regs[0].pool_metrics("canary").window(30.0, clock.t)
            assert (mine.requests, mine.errors) == (4, 1)
            # When the n-th came, to the end of its second.
            since = clock.t - 2.0
            assert [windows[0].nth_since("canary", since, n) for n in (6, 12, 13)] == [
                clock.t - 1.0,
                clock.t,
                None,
            ]
            srv.stop()
            with pytest.raises(StoreUnavailable):
                await windows[0].exchange()
            assert windows[0].window("canary", 30.0, clock.t).requests == 12  # still fresh
            clock.t += 1.1  # stale now: this process's own window
            got = windows[0].window("canary", 30.0, clock.t)
            assert (got.requests, got.errors) == (mine.requests, mine.errors)
        finally:
            for w in windows:
                await w.counters.close()


async def test_a_rollback_decided_by_several_processes_at_once_is_published_once(request):
    with redis_server() as srv:
        controls = [Control(srv.url, 1.0, request.node.name) for _ in range(3)]
        try:
            first = await controls[0].publish({"pools": []})
            for c in controls[1:]:
                await c.resync(lambda doc: None)
                assert c.version == first
            # All three decide from version `first`; only one may publish.
            results = await asyncio.gather(
                *(c.publish({"pools": [], "by": i}, expect=first) for i, c in enumerate(controls))
            )
            assert sorted(r > 0 for r in results) == [False, False, True]
            assert await controls[0].publish({"pools": []}, expect=first) == 0
        finally:
            for c in controls:
                await c.close()


async def test_a_store_marked_down_is_up_again_once_redis_answers(request):
    """Failing closed, a store marked down is probed: requests are refused at once while
    Redis is gone (none waits out the store timeout) and served by Redis again as soon
    as it answers, not when `retry_s` (here 30 s) after the last failure is out."""
    with redis_server() as srv:
        shared = RedisStore(srv.url, 0.25, request.node.name)
        store = Guarded(shared, MemoryStore(60, 100), fail_open=False, retry_s=30.0)
        try:
            assert await store.admit("r", 1.0, 5.0, "s", "a", 2, 30) == (0.0, True)
            srv.freeze()
            try:
                with pytest.raises(StoreUnavailable):  # the store timeout, once
                    await store.admit("r", 1.0, 5.0, "s", "b", 2, 30)
                tried: list[tuple[object, ...]] = []
                real_admit = shared.admit

                async def counted(*args: Any) -> tuple[float, bool]:
                    tried.append(args)
                    return await real_admit(*args)

                shared.admit = counted  # type: ignore[method-assign]
                t0 = time.monotonic()
                for lease in ("c", "d", "e"):
                    with pytest.raises(StoreUnavailable):
                        await store.admit("r", 1.0, 5.0, "s", lease, 2, 30)
                # Refused without trying the store and without waiting (a try takes 0.25 s).
                assert tried == [] and time.monotonic() - t0 < 0.6
                shared.admit = real_admit  # type: ignore[method-assign]
            finally:
                srv.thaw()

            async def served_by_redis() -> bool:
                return store.up

            await eventually_async(served_by_redis, what="up again", timeout=5.0, interval=0.02)
            assert await store.admit("r", 1.0, 5.0, "s", "f", 2, 30) == (0.0, True)
            assert await store.admit("r", 1.0, 5.0, "s", "g", 2, 30) == (0.0, False)  # a, f
        finally:
            await store.close()
