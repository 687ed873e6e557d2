"""The store in Redis (`--store-url`): each check-and-update one Lua script on Redis's clock
(`TIME`); leases renewed by their holder every third of their ttl; pins keys with a ttl
(`GETEX`). Every key on one server (no cluster). Failures raise `StoreUnavailable` (a
dead pooled connection retried once first, nothing else: `edge.store.connection`), and
`edge.store.guarded` falls back at once instead of waiting."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from edge.store.base import StoreUnavailable
from edge.store.connection import RedisConnection

log = logging.getLogger("sluice.edge")

# The scripts share these Lua functions (each script is a few lines over them).
# `clock`: Redis's time in seconds (buckets) and whole ms (lease expiries).
# `take`: the bucket `key` (`tokens`, `stamp`) refilled to `now`, then `cost` taken if
# there (or `force`); returns the wait (0 when taken). The hash expires once it would
# be full again.
# `acquire`: the lease set `key` without its lapsed leases; holds `lease` (expiring at
# now + ttl ms) if it is held already or fewer than `limit` are; returns 1 held, 0 full.
LIB = """
local function clock()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s + us / 1000000, s * 1000 + math.floor(us / 1000)
end
local function take(key, now, rate, burst, cost, force)
  local v = redis.call('HMGET', key, 'tokens', 'stamp')
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
  redis.call('HSET', key, 'tokens', tostring(tokens), 'stamp', tostring(now))
  redis.call('PEXPIRE', key, math.ceil((burst - tokens) / rate * 1000) + 1000)
  return wait
end
local function acquire(key, now_ms, lease, limit, ttl)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now_ms)
  if not redis.call('ZSCORE', key, lease) then
    if redis.call('ZCARD', key) >= limit then return 0 end
  end
  redis.call('ZADD', key, now_ms + ttl, lease)
  redis.call('PEXPIRE', key, ttl * 2)
  return 1
end
"""

# KEYS[1] bucket; ARGV rate, burst, cost, force (1/0). Returns the wait (s) as a string
# (Lua numbers come back as integers otherwise).
TAKE = (
    LIB
    + """
local now = clock()
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
return tostring(take(KEYS[1], now, rate, burst, cost, ARGV[4] == '1'))
"""
)

# KEYS[1] leases; ARGV lease, limit, ttl_ms. Returns 1 when held, 0 when full.
ACQUIRE = (
    LIB
    + """
local _, now_ms = clock()
return acquire(KEYS[1], now_ms, ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]))
"""
)

# KEYS[1] bucket, KEYS[2] leases; ARGV rate, burst, lease, limit, ttl_ms. One token,
# then the lease only if the token was there (a full set keeps the token spent, as a
# take and then an acquire would). Returns {wait as a string, 1 held / 0 not}.
ADMIT = (
    LIB
    + """
local now, now_ms = clock()
local wait = take(KEYS[1], now, tonumber(ARGV[1]), tonumber(ARGV[2]), 1, false)
if wait > 0 then return {tostring(wait), 0} end
return {'0', acquire(KEYS[2], now_ms, ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]))}
"""
)

# KEYS[1] leases, KEYS[2] bucket; ARGV lease, rate, burst, cost. Lets the lease go and
# takes `cost` by force (a settlement: negative gives back). Returns 1.
FINISH = (
    LIB
    + """
redis.call('ZREM', KEYS[1], ARGV[1])
local now = clock()
take(KEYS[2], now, tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), true)
return 1
"""
)

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


class RedisStore(RedisConnection):
    """`edge.store.base.Store` in Redis (see the module docstring)."""

    def __init__(self, url: str, timeout_s: float, prefix: str = "sluice") -> None:
        super().__init__(url, timeout_s, decode_responses=True)
        self.prefix = prefix
        self._take = self.client.register_script(TAKE)
        self._acquire = self.client.register_script(ACQUIRE)
        self._admit = self.client.register_script(ADMIT)
        self._finish = self.client.register_script(FINISH)
        self._renew = self.client.register_script(RENEW)
        self.held: dict[tuple[str, str], float] = {}  # (key, lease) -> ttl_s, renewed here
        self._renewer: asyncio.Task[None] | None = None

    def key(self, kind: str, key: str) -> str:
        return f"{self.prefix}:{kind}:{key}"

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

    async def admit(
        self, bucket: str, rate: float, burst: float, key: str, lease: str, limit: int, ttl_s: float
    ) -> tuple[float, bool]:
        keys = [self.key("bucket", bucket), self.key("leases", key)]
        args: list[Any] = [repr(rate), repr(burst), lease, limit, max(1, int(ttl_s * 1000))]
        wait, held = await self.call(self._admit(keys=keys, args=args))
        if held:
            self.held[(key, lease)] = ttl_s
            self._start_renewer(ttl_s)
        return float(wait), bool(held)

    async def finish(
        self, key: str, lease: str, bucket: str, rate: float, burst: float, cost: float
    ) -> None:
        self.held.pop((key, lease), None)
        keys = [self.key("leases", key), self.key("bucket", bucket)]
        args: list[Any] = [lease, repr(rate), repr(burst), repr(cost)]
        await self.call(self._finish(keys=keys, args=args))

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
        await super().close()
