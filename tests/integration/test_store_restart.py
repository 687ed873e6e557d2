"""The shared store after Redis comes back, against a real redis-server: two edge
replicas (two `Guarded` stores over their own Redis clients) in both failure modes,
with Redis killed -9 and restarted empty, flushed, and frozen. No key runs more streams
than its limit across the replicas, and once Redis answers no operation fails (in closed
mode: no refusal)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from edge.store.base import StoreUnavailable
from edge.store.connection import cancel_and_wait
from edge.store.guarded import Guarded
from edge.store.memory import MemoryStore
from edge.store.redis import RECOVER_S, RedisStore
from tests.redis_proc import RedisServer, redis_server
from tests.waits import eventually_async

MODES = pytest.mark.parametrize("fail_open", [True, False], ids=["open", "closed"])
POOL = 8  # connections each replica's pool holds before the fault


@contextlib.asynccontextmanager
async def replicas(
    srv: RedisServer, prefix: str, fail_open: bool, n: int = 2, timeout_s: float = 0.5
) -> AsyncIterator[list[Guarded]]:
    stores = [
        Guarded(RedisStore(srv.url, timeout_s, prefix), MemoryStore(60, 100), fail_open)
        for _ in range(n)
    ]
    try:
        yield stores
    finally:
        for s in stores:
            await s.close()


async def answers(srv: RedisServer) -> None:
    """Redis answers a client of its own (not one of the replicas' pools)."""
    check = RedisStore(srv.url, 1.0, "check")
    try:
        await check.ping()
    finally:
        await check.close()


@MODES
async def test_stale_pooled_connections_after_a_kill_are_retried_not_failures(fail_open, request):
    with redis_server() as srv:
        async with replicas(srv, request.node.name, fail_open) as stores:
            for s in stores:  # each pool holds POOL connections
                await asyncio.gather(*(s.take(f"k{i}", 100.0, 100.0) for i in range(POOL)))
                assert isinstance(s.shared, RedisStore)
                assert len(s.shared.client.connection_pool._available_connections) == POOL
            srv.kill()
            srv.start()  # empty, on the same port: every pooled connection is dead
            await answers(srv)
            for round_ in range(3):
                got = await asyncio.gather(
                    *(
                        s.admit("r", 100.0, 100.0, "s", f"{n}-{round_}-{i}", 100, 30)
                        for n, s in enumerate(stores)
                        for i in range(POOL)
                    )
                )
                assert got == [(0.0, True)] * (2 * POOL)
            # Not one operation failed or was answered by the failure mode.
            assert [(s.failures, s.fallbacks, s.up) for s in stores] == [(0, 0, True)] * 2


LIMIT = 4  # the key's stream limit, across the replicas
RATE = (1e6, 1e6)  # a rate limit that never refuses here


async def leases(srv: RedisServer, prefix: str, key: str = "k") -> set[str]:
    """The leases of `key` in Redis now, asked on a client of its own."""
    check = RedisStore(srv.url, 1.0, prefix)
    try:
        got = await check.call(check.client.zrange(check.key("leases", key), 0, -1))
        return set(got)
    finally:
        await check.close()


async def flushall(srv: RedisServer) -> None:
    check = RedisStore(srv.url, 1.0, "check")
    try:
        await check.call(check.client.flushall())
    finally:
        await check.close()


async def fill(stores: list[Guarded]) -> None:
    """Two streams on each replica: the key's limit is full."""
    for n, s in enumerate(stores):
        for i in range(LIMIT // 2):
            assert await s.admit("r", *RATE, "k", f"{n}-{i}", LIMIT, 30) == (0.0, True)


@MODES
@pytest.mark.parametrize("fault", ["restart", "flushall"])
async def test_streams_running_when_redis_lost_them_are_counted_again(fault, fail_open, request):
    """Redis restarted empty (kill -9) or flushed while a key's four streams run: from the
    first admission after the fault, for longer than the holders take to re-assert, both
    replicas try for a fifth and neither gets it, without a single failure; then Redis
    holds the four again, and a slot let go is taken at once (no spurious refusal)."""
    prefix = request.node.name
    with redis_server() as srv:
        async with replicas(srv, prefix, fail_open) as stores:
            await fill(stores)
            if fault == "restart":
                srv.kill()
                srv.start()
            else:
                await flushall(srv)
            assert await leases(srv, prefix) == set()  # lost
            t0, tries = time.monotonic(), 0
            while time.monotonic() - t0 < RECOVER_S + 0.5:
                got = await asyncio.gather(
                    *(
                        s.admit("r", *RATE, "k", f"x{n}-{tries}", LIMIT, 30)
                        for n, s in enumerate(stores)
                    )
                )
                assert got == [(0.0, False)] * 2
                tries += 1
            assert await leases(srv, prefix) == {"0-0", "0-1", "1-0", "1-1"}
            assert [(s.failures, s.fallbacks) for s in stores] == [(0, 0)] * 2
            await stores[0].finish("k", "0-0", "r", *RATE, 0)
            assert await stores[1].admit("r", *RATE, "k", "next", LIMIT, 30) == (0.0, True)
            assert await stores[0].admit("r", *RATE, "k", "over", LIMIT, 30) == (0.0, False)


@MODES
async def test_an_admission_that_timed_out_on_a_frozen_redis_never_holds_a_slot(fail_open, request):
    """Redis frozen (SIGSTOP) past the store timeout while an admission waits: it fails by
    the mode (open: this replica's part of the limit, less the streams it holds in Redis;
    closed: StoreUnavailable), and once Redis thaws and runs what waited in its sockets,
    the admission took no slot there: Redis holds exactly the streams that run."""
    prefix = request.node.name
    with redis_server() as srv:
        async with replicas(srv, prefix, fail_open, timeout_s=0.3) as stores:
            a, b = stores
            assert await a.admit("r", *RATE, "k", "a0", LIMIT, 30) == (0.0, True)
            assert await b.admit("r", *RATE, "k", "b0", LIMIT, 30) == (0.0, True)
            srv.freeze()
            try:
                if fail_open:
                    # b's look: 2 of 4 held, 1 its own; it counts no other replica (none
                    # renewed its presence here): its own and the 2 free, 2 more here.
                    for i in range(LIMIT):
                        got = await b.admit("r", *RATE, "k", f"b{i + 1}", LIMIT, 30)
                        assert got == (0.0, i < 2)
                    assert b.holding("k") == 3
                else:
                    with pytest.raises(StoreUnavailable):
                        await b.admit("r", *RATE, "k", "b1", LIMIT, 30)
            finally:
                srv.thaw()
            await answers(srv)
            running = {"a0", "b0", "b1", "b2"} if fail_open else {"a0", "b0"}
            assert await leases(srv, prefix) <= running
            await eventually_async(
                lambda: not b.shared.orphans, what="the timed-out lease let go", timeout=5
            )

            async def holds_what_runs() -> bool:  # those admitted meanwhile: the renewer
                return await leases(srv, prefix) == running

            await eventually_async(holds_what_runs, what=f"Redis holds {running}", timeout=5)


@contextlib.asynccontextmanager
async def present(stores: list[Guarded]) -> AsyncIterator[None]:
    """Each replica's presence renewed (the lifespan's task), until each counts them all."""
    beats = [asyncio.create_task(s.run()) for s in stores]
    try:
        await eventually_async(
            lambda: all(s.shared.presence.replicas == len(stores) for s in stores),
            what="each replica counts the others",
            timeout=5,
        )
        yield
    finally:
        for t in beats:
            await cancel_and_wait(t, 1.0)


@pytest.mark.parametrize("fault", ["freeze", "kill"])
async def test_failing_open_the_replicas_together_never_pass_a_keys_limit(fault, request):
    """Two replicas failing open while Redis is frozen (SIGSTOP) or killed -9 (restarted
    empty after): each holds its own streams and its part of the slots free at its last
    look (here none: the key is full, 3 streams on one replica and 1 on the other), so
    together never more than the limit, however often they try; the slots of streams
    that end meanwhile are shared out (two freed on a: one for each, b's look is older:
    a gets one). Once Redis answers it holds exactly the streams that run (the ones
    admitted meanwhile added, the ended ones removed), and the free slots are admitted
    at once: no spurious refusal."""
    prefix = request.node.name
    with redis_server() as srv:
        async with replicas(srv, prefix, True, timeout_s=0.25) as stores, present(stores):
            a, b = stores
            running: dict[str, Guarded] = {}
            tries = iter(range(1000))

            async def admitted(s: Guarded) -> bool:
                lease = f"{'ab'[stores.index(s)]}{next(tries)}"
                wait, held = await s.admit("r", *RATE, "k", lease, LIMIT, 30)
                assert wait == 0
                if held:
                    running[lease] = s
                assert len(running) <= LIMIT, sorted(running)
                return held

            async def end(lease: str) -> None:
                await running.pop(lease).finish("k", lease, "r", *RATE, 0)

            assert [await admitted(s) for s in (a, a, a, b)] == [True] * 4
            assert [await admitted(s) for s in (a, b)] == [False] * 2  # full: each looks
            srv.freeze() if fault == "freeze" else srv.kill()
            try:
                assert [await admitted(s) for s in (a, b) * 3] == [False] * 6
                assert a.failures and b.failures  # failing open, not refused
                for lease in [k for k, s in running.items() if s is a][:2]:
                    await end(lease)
                assert [await admitted(s) for s in (a, b) * 3] == [True] + [False] * 5
                assert (a.holding("k"), b.holding("k")) == (2, 1)
            finally:
                srv.thaw() if fault == "freeze" else srv.start()
            await answers(srv)

            async def redis_holds_what_runs() -> bool:
                return a.up and b.up and await leases(srv, prefix) == set(running)

            await eventually_async(
                redis_holds_what_runs, what="Redis holds the running streams", timeout=5
            )
            fallbacks = [s.fallbacks for s in stores]
            assert [await admitted(s) for s in (b, a, b)] == [True, False, False]
            assert await leases(srv, prefix) == set(running)
            assert [s.fallbacks for s in stores] == fallbacks  # Redis answered each
