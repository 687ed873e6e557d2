"""One Redis connection as every part of the shared store uses it. A connection found dead
("Connection closed by server": the pool's idle ones after Redis restarted) is retried once
on a fresh one: redis-py's own `Retry`, limited to `ConnectionError` (it reconnects before
the second try). A timeout is not retried: `--store-timeout` bounds the operation, tries
included. Every failure left is `StoreUnavailable`; `guarded.py` decides what it means."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from edge.store.base import StoreUnavailable

T = TypeVar("T")


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
