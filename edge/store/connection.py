"""One Redis connection as every part of the shared store uses it. A connection found dead
("Connection closed by server": the pool's idle ones after Redis restarted) is retried once
on a fresh one: redis-py's own `Retry`, limited to `ConnectionError` (it reconnects before
the second try). A timeout is not retried: `--store-timeout` bounds the operation, tries
included. Every failure left is `StoreUnavailable`; `guarded.py` decides what it means.
A task that calls Redis is stopped with `cancel_and_wait` (a cancellation can be lost)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from edge.store.base import StoreUnavailable

T = TypeVar("T")


async def cancel_and_wait(task: asyncio.Task[Any], grace_s: float, tries: int = 3) -> bool:
    """Cancel `task` and wait for its end, `grace_s` at most each try, cancelling again
    after a try that did not end it; whether it ended. Python 3.11's `asyncio.wait_for`
    returns its result when that result and a cancellation arrive in the same turn of
    the loop, and the cancellation is gone (CPython gh-86296, fixed in 3.12); redis-py
    sends every command through it, so a loop cancelled then runs on (a busy machine
    makes it likely: a test once waited 300 s on such a lease renewer)."""
    for _ in range(tries):
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=grace_s)
        if done:
            if not task.cancelled():
                task.exception()  # retrieved: its owner logged or handled it
            return True
    return False


class RedisConnection:
    """A client for `url` whose operations each end within `timeout_s`."""

    def __init__(self, url: str, timeout_s: float, *, decode_responses: bool = False) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.client: aioredis.Redis = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            decode_responses=decode_responses,
        )

    async def call(self, op: Awaitable[T]) -> T:
        """One Redis operation within the timeout; any failure is StoreUnavailable."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await op
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"redis at {self.url}: {exc or type(exc).__name__}") from None

    async def close(self) -> None:
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            async with asyncio.timeout(self.timeout_s):
                await self.client.aclose()
