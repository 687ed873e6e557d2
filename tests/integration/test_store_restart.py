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
    the mode (open: this replica's own slots, less the streams it holds in Redis; closed:
    StoreUnavailable), and once Redis thaws and runs what waited in its sockets, the
    admission took no slot there: Redis holds exactly the streams that run."""
    prefix = request.node.name
    with redis_server() as srv:
        async with replicas(srv, prefix, fail_open, timeout_s=0.3) as stores:
            a, b = stores
            assert await a.admit("r", *RATE, "k", "a0", LIMIT, 30) == (0.0, True)
            assert await b.admit("r", *RATE, "k", "b0", LIMIT, 30) == (0.0, True)
            srv.freeze()
            try:
                if fail_open:
                    for i in range(LIMIT):  # b holds one in Redis: three more here
                        got = await b.admit("r", *RATE, "k", f"b{i + 1}", LIMIT, 30)
                        assert got == (0.0, i < LIMIT - 1)
                    assert b.holding("k") == LIMIT
                else:
                    with pytest.raises(StoreUnavailable):
                        await b.admit("r", *RATE, "k", "b1", LIMIT, 30)
            finally:
                srv.thaw()
            await answers(srv)
            assert await leases(srv, prefix) == {"a0", "b0"}
            await eventually_async(
                lambda: not b.shared.orphans, what="the timed-out lease let go", timeout=5
            )
            assert await leases(srv, prefix) == {"a0", "b0"}
