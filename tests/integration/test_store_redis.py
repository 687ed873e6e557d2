"""The shared store against a real redis-server: atomic buckets and leases across
clients (each client stands for an edge process), pins, and the failure modes with the
server stopped and started again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from edge.config import RoutingConfig
from edge.store.base import StoreUnavailable
from edge.store.control import Control
from edge.store.guarded import Guarded
from edge.store.memory import MemoryStore
from edge.store.redis import RedisStore
from edge.store.windows import WindowCounters
from edge.upstream.channel import ChannelFactory
from edge.upstream.pools import PoolSpec
from edge.upstream.registry import PoolRegistry
from edge.upstream.windows import FleetWindows
from tests.redis_proc import RedisServer, redis_server


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
        deadline = time.monotonic() + 2
        while await a.take("k", 20.0, 1.0) > 0:  # refilled within its wait, give or take
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
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
            await asyncio.sleep(0.05)
        await holder.close()  # the holder dies without releasing: nobody renews it
        deadline = time.monotonic() + 2
        while not await other.acquire("s", "theirs", 1, 0.3):
            assert time.monotonic() < deadline, "a dead holder's lease never lapsed"
            await asyncio.sleep(0.02)
    finally:
        await close(other)


async def test_pins_live_from_their_last_use(server, request):
    a, b = clients(server, 2, request.node.name)
    try:
        assert await a.get_pin("sess", 10) is None
        await a.put_pin("sess", "canary", 10)
        assert await b.get_pin("sess", 10) == "canary"
        await a.put_pin("short", "stable", 0.2)
        deadline = time.monotonic() + 2
        while await b.get_pin("short", 0.2) is not None:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.3)  # longer than its ttl: no get renews it in between
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
            if fail_open:  # local limits: a fresh local bucket and slots
                assert [await store.take("k", 1.0, 2.0) for _ in range(3)][:2] == [0, 0]
                assert await store.acquire("s", "b", 1, 30) is True
                assert await store.acquire("s", "c", 1, 30) is False
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
            t_up = time.monotonic()
            while True:  # the shared bucket is back: burst 2, then refused
                before = store.fallbacks
                try:
                    waits = [await store.take("k2", 0.001, 2.0) for _ in range(3)]
                except StoreUnavailable:  # closed, until its retry
                    waits = []
                if store.fallbacks == before and waits[:2] == [0, 0] and waits[2] > 0:
                    break
                assert time.monotonic() - t_up < 2.0, "limits not shared again within 2 s"
                await asyncio.sleep(0.05)
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
