"""The store in Redis (`--store-url`): each check-and-update one Lua script on Redis's clock
(`TIME`), every key on one server; failures raise `StoreUnavailable` (a dead pooled
connection retried once first: `connection.py`), `guarded.py` decides what that means.
Redis losing its data: holders re-add their leases (renewals `RENEW_MAX_S` apart) while
admissions wait `RECOVER_S`; a frozen Redis: a script past its deadline does nothing."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

from edge.store.base import StoreUnavailable
from edge.store.connection import RedisConnection, cancel_and_wait
from edge.store.presence import Presence, Sightings

log = logging.getLogger("sluice.edge")

# The scripts share these Lua functions (each script is a few lines over them).
# `clock`: Redis's time in seconds (buckets) and whole ms (lease expiries).
# `late`: the caller's deadline (ms on Redis's clock, 0: none) has passed: the caller
# gave up waiting (its timeout), so the script must not take effect now.
# `settled`: ms until the lease sets can be trusted again. The key `marker` lives as long
# as the data: when it is missing, Redis lost everything (a restart, FLUSHALL, a failover)
# and the holders of running streams re-assert their leases at their next renewal (at
# most RENEW_MAX_S away); until then (`recover` ms) admissions wait. A process's very first
# call (`first`) finds a new store, not a lost one, and sets the marker settled.
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
local function late(now_ms, deadline)
  return deadline > 0 and now_ms > deadline
end
local function settled(marker, now_ms, recover, first)
  local v = redis.call('GET', marker)
  if not v then
    local at = now_ms
    if not first then at = now_ms + recover end
    redis.call('SET', marker, at)
    return at - now_ms
  end
  return math.max(0, tonumber(v) - now_ms)
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

# Every script answers Redis's clock (ms) last, from which the caller keeps the offset
# of Redis's clock to its own (`RedisStore._deadline`). A late call answers 'late'.

# KEYS[1] bucket; ARGV rate, burst, cost, force (1/0), deadline. Returns {the wait (s)
# as a string (Lua numbers come back as integers otherwise), now}.
TAKE = (
    LIB
    + """
local now, now_ms = clock()
if late(now_ms, tonumber(ARGV[5])) then return {'late', now_ms} end
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
return {tostring(take(KEYS[1], now, rate, burst, cost, ARGV[4] == '1')), now_ms}
"""
)

# KEYS[1] leases, KEYS[2] marker; ARGV lease, limit, ttl_ms, deadline, recover_ms, first.
# Returns {1 held / 0 full / 'late' / 'wait', ms to wait, leases held then (-1: not
# asked), now}.
ACQUIRE = (
    LIB
    + """
local _, now_ms = clock()
if late(now_ms, tonumber(ARGV[4])) then return {'late', 0, -1, now_ms} end
local wait = settled(KEYS[2], now_ms, tonumber(ARGV[5]), ARGV[6] == '1')
if wait > 0 then return {'wait', wait, -1, now_ms} end
local held = acquire(KEYS[1], now_ms, ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]))
return {held, 0, redis.call('ZCARD', KEYS[1]), now_ms}
"""
)

# KEYS[1] bucket, KEYS[2] leases, KEYS[3] marker; ARGV rate, burst, lease, limit, ttl_ms,
# deadline, recover_ms, first. One token, then the lease only if the token was there (a
# full set keeps the token spent, as a take and then an acquire would); nothing while
# the lease sets settle. Returns {the wait as a string, 1 held / 0 not / 'wait' (then
# the ms to wait) / 'late', ms, leases held then (-1: not asked), now}.
ADMIT = (
    LIB
    + """
local now, now_ms = clock()
if late(now_ms, tonumber(ARGV[6])) then return {'0', 'late', 0, -1, now_ms} end
local settling = settled(KEYS[3], now_ms, tonumber(ARGV[7]), ARGV[8] == '1')
if settling > 0 then return {'0', 'wait', settling, -1, now_ms} end
local wait = take(KEYS[1], now, tonumber(ARGV[1]), tonumber(ARGV[2]), 1, false)
if wait > 0 then return {tostring(wait), 0, 0, -1, now_ms} end
local held = acquire(KEYS[2], now_ms, ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]))
return {'0', held, 0, redis.call('ZCARD', KEYS[2]), now_ms}
"""
)

# KEYS[1] leases, KEYS[2] bucket; ARGV lease, rate, burst, cost. Lets the lease go and
# takes `cost` by force (a settlement: negative gives back; late is fine). Returns 1.
FINISH = (
    LIB
    + """
redis.call('ZREM', KEYS[1], ARGV[1])
local now = clock()
take(KEYS[2], now, tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), true)
return 1
"""
)

# KEYS[1] marker, then the lease sets; ARGV[1] ttl_ms, ARGV[2] recover_ms, ARGV[3]
# deadline (a renewal run late could re-add a lease let go since), then one lease per
# lease set. Renews each lease, re-adding those the store lost or never had (their
# streams run: admitted while it failed open); a missing marker (Redis lost everything)
# or a lease re-added starts the settling time, so the other holders re-add theirs
# before anyone is admitted. Returns {leases re-added, the leases each set holds, now}.
RENEW = (
    LIB
    + """
local _, now_ms = clock()
if late(now_ms, tonumber(ARGV[3])) then return {'late', {}, now_ms} end
settled(KEYS[1], now_ms, tonumber(ARGV[2]), false)
local ttl = tonumber(ARGV[1])
local added, held = 0, {}
for i = 2, #KEYS do
  added = added + redis.call('ZADD', KEYS[i], now_ms + ttl, ARGV[i + 2])
  redis.call('PEXPIRE', KEYS[i], ttl * 2)
end
for i = 2, #KEYS do held[i - 1] = redis.call('ZCARD', KEYS[i]) end
if added > 0 and tonumber(redis.call('GET', KEYS[1])) < now_ms + tonumber(ARGV[2]) then
  redis.call('SET', KEYS[1], now_ms + tonumber(ARGV[2]))
end
return {added, held, now_ms}
"""
)

# A holder renews its leases this often at most (a third of their ttl when shorter), so
# after Redis lost them every running stream is counted again within RENEW_MAX_S; the
# lease sets are left to settle for RECOVER_S (two renewals and a margin) meanwhile.
RENEW_MAX_S = 0.5
RECOVER_S = 2 * RENEW_MAX_S + 0.25
# The share of `--store-timeout` a script may start within (the rest is for the answer
# to come back): one that starts later does nothing.
DEADLINE_SHARE = 0.8


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
        self.orphans: set[tuple[str, str]] = set()  # leases whose admission timed out
        self.reasserted = 0  # leases re-added after the store lost them (metrics, tests)
        self._renewer: asyncio.Task[None] | None = None
        self._closing = False  # the renewer ends at its next turn (a cancel can be lost)
        self._first = True  # no script answered yet: a missing marker is a new store
        self._offset_ms: float | None = None  # Redis's clock less this process's
        self.presence = Presence(self, f"{prefix}:processes")
        self.sightings = Sightings()  # each key's leases at the last look (outage rule)

    def key(self, kind: str, key: str) -> str:
        return f"{self.prefix}:{kind}:{key}"

    @property
    def marker(self) -> str:
        return f"{self.prefix}:marker"

    async def ping(self) -> None:
        await self.call(self.client.ping())  # type: ignore[arg-type]

    async def _script(self, script: Any, keys: list[str], args: list[Any]) -> list[Any]:
        """Run `script`; keep Redis's clock offset from its answer (its last item)."""
        sent = time.time() * 1000
        got = await self.call(script(keys=keys, args=args))
        self._offset_ms = float(got[-1]) - (sent + time.time() * 1000) / 2
        self._first = False
        return list(got)

    def _deadline(self) -> int:
        """The latest Redis time (ms) a script of this call may take effect at (0: no
        offset known yet, no deadline)."""
        if self._offset_ms is None:
            return 0
        return int(time.time() * 1000 + self._offset_ms + self.timeout_s * DEADLINE_SHARE * 1000)

    def _late(self) -> StoreUnavailable:
        return StoreUnavailable(f"redis at {self.url}: slower than the store timeout")

    async def take(
        self, key: str, rate: float, burst: float, cost: float = 1.0, force: bool = False
    ) -> float:
        deadline = 0 if force else self._deadline()  # a settlement is owed, late or not
        args: list[Any] = [repr(rate), repr(burst), repr(cost), "1" if force else "0", deadline]
        wait, _ = await self._script(self._take, [self.key("bucket", key)], args)
        if wait == "late":
            raise self._late()
        return float(wait)

    async def acquire(self, key: str, lease: str, limit: int, ttl_s: float) -> bool:
        keys = [self.key("leases", key), self.marker]
        args: list[Any] = [lease, limit, max(1, int(ttl_s * 1000))]
        held, *_ = await self._admitting(key, lease, ttl_s, self._acquire, keys, args)
        return bool(held)

    async def admit(
        self, bucket: str, rate: float, burst: float, key: str, lease: str, limit: int, ttl_s: float
    ) -> tuple[float, bool]:
        keys = [self.key("bucket", bucket), self.key("leases", key), self.marker]
        args: list[Any] = [repr(rate), repr(burst), lease, limit, max(1, int(ttl_s * 1000))]
        wait, held, *_ = await self._admitting(key, lease, ttl_s, self._admit, keys, args)
        return float(wait), bool(held)

    async def _admitting(
        self, key: str, lease: str, ttl_s: float, script: Any, keys: list[str], args: list[Any]
    ) -> list[Any]:
        """Run a script that may hold `lease` (its answer ends: held, ms to wait, leases
        held, now), with its deadline, waiting while the lease sets settle; a held lease is
        renewed from then on. If the call fails the script may still run (Redis frozen,
        then thawed): past its deadline it does nothing, and the lease is an orphan the
        renewer lets go."""
        for _ in range(3):
            tail = [self._deadline(), int(RECOVER_S * 1000), "1" if self._first else "0"]
            asked = time.monotonic()
            try:
                got = await self._script(script, keys, args + tail)
            except StoreUnavailable:
                self._orphan(key, lease)
                raise
            held, wait_ms, count = got[-4], got[-3], got[-2]
            if held == "late":
                raise self._late()
            if held != "wait":
                if held:
                    self._hold(key, lease, ttl_s)
                if count >= 0:
                    self.sightings.saw(key, count, self.holding(key), asked)
                return got
            await asyncio.sleep(wait_ms / 1000)
        raise StoreUnavailable(f"redis at {self.url}: still settling after a reset")

    def _hold(self, key: str, lease: str, ttl_s: float) -> None:
        self.held[(key, lease)] = ttl_s
        self._start_renewer(ttl_s)

    def hold_later(self, key: str, lease: str, ttl_s: float) -> None:
        """A lease this process holds that Redis does not know (admitted while it failed
        open): renewed from now on, so added to Redis once it answers."""
        self._hold(key, lease, ttl_s)

    def forget(self, key: str, lease: str) -> None:
        """Let `lease` go without a call now (Redis fails): the renewer removes it there
        once Redis answers, so it holds no slot after the outage."""
        self._let_go(key, lease)
        self._orphan(key, lease)

    def _orphan(self, key: str, lease: str) -> None:
        self.orphans.add((key, lease))
        self._start_renewer(RENEW_MAX_S * 3)

    def _let_go(self, key: str, lease: str) -> None:
        if self.held.pop((key, lease), None) is not None:
            self.sightings.released(key)

    def outage_limit(self, key: str, limit: int) -> int:
        """The most leases of `key` this process may hold while this store fails (see
        `edge.store.presence`)."""
        presence = self.presence
        return self.sightings.limit(key, limit, presence.replicas, presence.rank)

    async def run(self) -> None:
        """The background work: this process's presence (the lifespan's task)."""
        await self.presence.run()

    async def release(self, key: str, lease: str) -> None:
        self._let_go(key, lease)
        try:
            await self.call(self.client.zrem(self.key("leases", key), lease))
        except StoreUnavailable:
            self._orphan(key, lease)  # removed once Redis answers
            raise

    async def finish(
        self, key: str, lease: str, bucket: str, rate: float, burst: float, cost: float
    ) -> None:
        self._let_go(key, lease)
        keys = [self.key("leases", key), self.key("bucket", bucket)]
        args: list[Any] = [lease, repr(rate), repr(burst), repr(cost)]
        try:
            await self.call(self._finish(keys=keys, args=args))
        except StoreUnavailable:
            self._orphan(key, lease)  # the lease removed once Redis answers
            raise

    def holding(self, key: str) -> int:
        return sum(k == key for k, _ in self.held)

    async def get_pin(self, key: str, ttl_s: float) -> str | None:
        pool = await self.call(self.client.getex(self.key("pin", key), px=int(ttl_s * 1000)))
        return pool if isinstance(pool, str) else None

    async def put_pin(self, key: str, pool: str, ttl_s: float) -> None:
        await self.call(self.client.set(self.key("pin", key), pool, px=int(ttl_s * 1000)))

    async def get_doc(self, key: str) -> str | None:
        doc = await self.call(self.client.get(self.key("doc", key)))
        return doc if isinstance(doc, str) else None

    async def put_doc(self, key: str, doc: str, ttl_s: float) -> None:
        await self.call(self.client.set(self.key("doc", key), doc, px=int(ttl_s * 1000)))

    async def delete_doc(self, key: str) -> bool:
        return bool(await self.call(self.client.delete(self.key("doc", key))))

    def _start_renewer(self, ttl_s: float) -> None:
        if self._renewer is None or self._renewer.done():
            every = min(ttl_s / 3, RENEW_MAX_S)
            self._renewer = asyncio.get_running_loop().create_task(self._renew_loop(every))

    async def _renew_loop(self, every: float) -> None:
        """Every `every` s, renew every lease this process still holds (one script call),
        re-adding those Redis lost, then let go the orphans and any lease released while
        the renewal ran (it may have re-added it). A failure is logged and tried again
        next time, the leases living on for the rest of their ttl meanwhile."""
        while (self.held or self.orphans) and not self._closing:
            await asyncio.sleep(every)
            held = list(self.held)
            try:
                if held:
                    keys = [self.marker, *(self.key("leases", k) for k, _ in held)]
                    ttl_ms = int(max(self.held.get(h, every * 3) for h in held) * 1000)
                    args: list[Any] = [ttl_ms, int(RECOVER_S * 1000), self._deadline()]
                    args += [lease for _, lease in held]
                    asked, own = time.monotonic(), Counter(k for k, _ in held)
                    added, counts, _ = await self._script(self._renew, keys, args)
                    if added == "late":
                        raise self._late()
                    for (k, _), count in zip(held, counts, strict=True):
                        self.sightings.saw(k, count, own[k], asked)
                    if added:
                        self.reasserted += added
                        log.warning("re-asserted %d stream leases the store had lost", added)
                gone = self.orphans | {h for h in held if h not in self.held}
                for k, lease in gone:
                    await self.call(self.client.zrem(self.key("leases", k), lease))
                    self.orphans.discard((k, lease))
            except StoreUnavailable as exc:
                log.warning("could not renew %d stream leases: %s", len(held), exc)

    async def close(self) -> None:
        self._closing = True
        grace = self.timeout_s + RENEW_MAX_S
        if self._renewer is not None and not await cancel_and_wait(self._renewer, grace):
            log.warning("the lease renewer did not stop; its leases lapse by their ttl")
        await self.presence.leave()
        await super().close()
