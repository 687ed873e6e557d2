"""The shared store in Redis (`--store-url redis://...`), through redis-py's asyncio API.

Every limit is one Lua script, so a check and its update are one atomic step however
many edge processes and replicas call at once, and the clock is Redis's own (`TIME`),
one for the fleet:

- `take`: a token bucket in a hash (`tokens`, `stamp`), refilled from the time elapsed;
  it expires once it would be full again (an idle key costs nothing).
- `acquire`: a sorted set of lease ids scored by their expiry; lapsed ones are dropped
  before counting. This process renews the leases it holds every third of their ttl,
  so a stream lasts as long as it runs while a crashed edge's slots free themselves.
- pins: plain keys with a ttl (`GETEX` renews on use).

Errors are not handled here: a connection refused, a timeout or a Redis error raises
`StoreUnavailable`, and `edge.store.guarded` decides what that means. redis-py's own
retries are off (one try, `--store-timeout` per operation): the caller falls back at
once instead of waiting out a backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from edge.store.base import StoreUnavailable

log = logging.getLogger("sluice.edge")
T = TypeVar("T")

# KEYS[1] bucket; ARGV rate, burst, cost, force (1/0). Returns the wait (s) as a string
# (Lua numbers come back as integers otherwise).
TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local cost, force = tonumber(ARGV[3]), ARGV[4] == '1'
local v = redis.call('HMGET', KEYS[1], 'tokens', 'stamp')
local tokens, stamp = tonumber(v[1]), tonumber(v[2])
if tokens == nil or stamp == nil then
  tokens = burst
else
  tokens = math.min(burst, tokens + math.max(0, now - stamp) * rate)
end
local wait = 0
if force or tokens >= cost then
  tokens = math.min(burst, tokens - cost)
else
  wait = (cost - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'stamp', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return tostring(wait)
"""

# KEYS[1] leases; ARGV lease, limit, ttl_ms. Returns 1 when held, 0 when full.
ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return 1
"""

# KEYS the lease sets; ARGV[1] ttl_ms, then one lease per key. Renews those still held.
RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'XX', now + ttl, ARGV[i + 1])
  redis.call('PEXPIRE', key, ttl * 2)
end
return #KEYS
"""


class RedisStore:
    """`edge.store.base.Store` in Redis (see the module docstring)."""

    def __init__(self, url: str, timeout_s: float, prefix: str = "sluice") -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.prefix = prefix
        self.client: aioredis.Redis = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            decode_responses=True,
        )
        self._take = self.client.register_script(TAKE)
        self._acquire = self.client.register_script(ACQUIRE)
        self._renew = self.client.register_script(RENEW)
        self.held: dict[tuple[str, str], float] = {}  # (key, lease) -> ttl_s, renewed here
        self._renewer: asyncio.Task[None] | None = None

    def key(self, kind: str, key: str) -> str:
        return f"{self.prefix}:{kind}:{key}"

    async def call(self, op: Awaitable[T]) -> T:
        """One Redis operation within the timeout; any failure is StoreUnavailable."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await op
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"redis at {self.url}: {exc or type(exc).__name__}") from None

    async def ping(self) -> None:
        await self.call(self.client.ping())  # type: ignore[arg-type]

    async def take(
        self, key: str, rate: float, burst: float, cost: float = 1.0, force: bool = False
    ) -> float:
        args: list[Any] = [repr(rate), repr(burst), repr(cost), "1" if force else "0"]
        wait = await self.call(self._take(keys=[self.key("bucket", key)], args=args))
        return float(wait)

    async def acquire(self, key: str, lease: str, limit: int, ttl_s: float) -> bool:
        ttl_ms = max(1, int(ttl_s * 1000))
        args: list[Any] = [lease, limit, ttl_ms]
        held = await self.call(self._acquire(keys=[self.key("leases", key)], args=args))
        if held:
            self.held[(key, lease)] = ttl_s
            self._start_renewer(ttl_s)
        return bool(held)

    async def release(self, key: str, lease: str) -> None:
        self.held.pop((key, lease), None)
        await self.call(self.client.zrem(self.key("leases", key), lease))

    async def get_pin(self, key: str, ttl_s: float) -> str | None:
        pool = await self.call(self.client.getex(self.key("pin", key), px=int(ttl_s * 1000)))
        return pool if isinstance(pool, str) else None

    async def put_pin(self, key: str, pool: str, ttl_s: float) -> None:
        await self.call(self.client.set(self.key("pin", key), pool, px=int(ttl_s * 1000)))

    def _start_renewer(self, ttl_s: float) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_loop(ttl_s))

    async def _renew_loop(self, ttl_s: float) -> None:
        """Every third of the ttl, renew every lease this process still holds (one script
        call); a failure is logged and tried again next time, the leases living on for
        the rest of their ttl meanwhile."""
        while self.held:
            await asyncio.sleep(ttl_s / 3)
            held = list(self.held)
            if not held:
                continue
            keys = [self.key("leases", k) for k, _ in held]
            args: list[Any] = [int(ttl_s * 1000), *(lease for _, lease in held)]
            try:
                await self.call(self._renew(keys=keys, args=args))
            except StoreUnavailable as exc:
                log.warning("could not renew %d stream leases: %s", len(held), exc)

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        with contextlib.suppress(RedisError, OSError):
            await self.client.aclose()
