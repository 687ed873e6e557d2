"""The shared store after Redis comes back, against a real redis-server: two edge
replicas (two `Guarded` stores over their own Redis clients) in both failure modes,
with Redis killed -9 and restarted empty, flushed, and frozen. No key runs more streams
than its limit across the replicas, and once Redis answers no operation fails."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from edge.store.guarded import Guarded
from edge.store.memory import MemoryStore
from edge.store.redis import RedisStore
from tests.redis_proc import RedisServer, redis_server

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
