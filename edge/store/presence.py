"""A key's stream limit across edge processes while Redis fails: the live processes (each
renews its presence: `Presence`) and per key the leases in Redis at this process's last
look, its own among them (`Sightings`). A process then holds its own and its part of the
slots then free (`outage_limit`): together, the limit. Its error: a process started in the
outage, admissions elsewhere since its last look (for a key it holds: `RENEW_MAX_S`)."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import zlib
from collections.abc import Callable
from typing import Any

import cachetools

from edge.store.base import StoreUnavailable
from edge.store.connection import RedisConnection

log = logging.getLogger("sluice.edge")

PRESENCE_EVERY_S = 1.0  # how often a process renews its presence
PRESENCE_TTL_S = 3.0  # a process not heard from for this long is not counted
SEEN_S = 30.0  # how long a look at a key is trusted (a key this process holds: renewed)
SEEN_MAX = 100_000  # keys remembered at most (least recently seen out first)

# KEYS[1] the processes (a sorted set: member, expiry on Redis's clock in ms); ARGV this
# process, ttl_ms. Renews it, drops the lapsed; returns {the live processes, now}.
BEAT = """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
redis.call('ZADD', KEYS[1], now_ms + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
return {redis.call('ZRANGE', KEYS[1], 0, -1), now_ms}
"""


def outage_limit(key: str, limit: int, total: int, own: int, replicas: int, rank: int) -> int:
    """The most streams of `key` one process may hold while the store fails: its `own` of
    the `total` held at its last look, and its part of the slots then free: an equal
    share, rounded down, and one of the remainder for as many processes as it has
    slots, by `rank` (this process's place among the live ones) turned by the key (so
    not always the same processes; crc32: the same in every process). A process whose
    part is 0 (fewer free slots than processes, not its turn; a key it saw full) admits
    none of that key until Redis is back."""
    n = max(1, replicas)
    free = max(0, limit - total)
    turn = (rank - zlib.crc32(key.encode())) % n
    return own + free // n + (1 if turn < free % n else 0)


class Presence:
    """This process's presence in the store, renewed every `PRESENCE_EVERY_S` by `run`
    (the lifespan's task); `replicas`: the live processes at the last answer (1 until
    then: this process alone)."""

    def __init__(self, conn: RedisConnection, key: str) -> None:
        self.conn = conn
        self.key = key
        self.me = secrets.token_hex(8)
        self.replicas = 1
        self.rank = 0  # this process's place among them (by id)
        self._beat = conn.client.register_script(BEAT)

    async def beat(self) -> int:
        ttl_ms = int(PRESENCE_TTL_S * 1000)
        live, _ = await self.conn.call(self._beat(keys=[self.key], args=[self.me, ttl_ms]))
        members = sorted(live)
        self.replicas = max(1, len(members))
        self.rank = members.index(self.me) if self.me in members else 0
        return self.replicas

    async def run(self) -> None:
        while True:
            try:
                await self.beat()
            except StoreUnavailable as exc:  # the last count stands: the outage's rule
                log.debug("presence not renewed: %s", exc)
            await asyncio.sleep(PRESENCE_EVERY_S)

    async def leave(self) -> None:
        """Not counted from now (a clean shutdown); best effort, else it lapses."""
        try:
            await self.conn.call(self.conn.client.zrem(self.key, self.me))
        except StoreUnavailable:
            pass


class Sightings:
    """Per key: (streams held in Redis, this process's of them, when asked) at its last
    look, from the answers of the scripts that hold and renew leases."""

    def __init__(self, timer: Callable[[], float] = time.monotonic) -> None:
        self.timer = timer
        self._seen: cachetools.TTLCache[str, tuple[int, int, float]] = cachetools.TTLCache(
            SEEN_MAX, SEEN_S, timer
        )

    def saw(self, key: str, total: Any, own: int, asked: float) -> None:
        """An answer sent at `asked` (this process's clock): unless a later one came first."""
        last = self._seen.get(key)
        if last is None or last[2] <= asked:
            self._seen[key] = (int(total), own, asked)

    def released(self, key: str) -> None:
        """One of this process's leases of `key` let go."""
        last = self._seen.get(key)
        if last is not None:  # an answer asked before this must not undo it
            total, own, _ = last
            self._seen[key] = (max(0, total - 1), max(0, own - 1), self.timer())

    def limit(self, key: str, limit: int, replicas: int, rank: int) -> int:
        total, own, _ = self._seen.get(key, (0, 0, 0.0))
        return outage_limit(key, limit, total, own, replicas, rank)
