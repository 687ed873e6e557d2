"""The fleet's pools snapshot in Redis. `publish`: one Lua script (the version up to Redis's
clock in ms, so it rises even after Redis lost its data; the snapshot stored; its number
published); with `expect=` a compare-and-set. `watch`: subscribe, then read (nothing is
missed), apply only newer versions; after a lost connection both again, every `RETRY_S`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import orjson
from redis.exceptions import RedisError

from edge.store.connection import RedisConnection

log = logging.getLogger("sluice.edge")
RETRY_S = 0.5

# KEYS version, snapshot; ARGV the document (JSON without its version), channel, and
# the version it must replace ('': any). Returns the new version, 0 if it was not that.
PUBLISH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if ARGV[3] ~= '' and current ~= tonumber(ARGV[3]) then return 0 end
local v = math.max(current + 1, now)
redis.call('SET', KEYS[1], v)
redis.call('SET', KEYS[2], v .. ' ' .. ARGV[1])
redis.call('PUBLISH', ARGV[2], v)
return v
"""


class Control(RedisConnection):
    """The fleet's desired state in Redis (see the module docstring)."""

    def __init__(self, url: str, timeout_s: float, prefix: str = "sluice") -> None:
        super().__init__(url, timeout_s)
        self.keys = [f"{prefix}:control:version", f"{prefix}:control:snapshot"]
        self.channel = f"{prefix}:control"
        self._publish = self.client.register_script(PUBLISH)
        self.version = 0  # the last snapshot applied (or published) here
        self.applied = 0  # snapshots applied from others (metrics, tests)

    async def publish(self, doc: dict[str, Any], expect: int | None = None) -> int:
        """Store `doc` as the fleet's state; its version (StoreUnavailable if Redis fails).
        `expect`: only if the fleet's version is still that one (a compare-and-set: one
        of several processes deciding the same change at once wins), else 0."""
        cas = "" if expect is None else str(expect)
        args: list[Any] = [orjson.dumps(doc), self.channel, cas]
        version = int(await self.call(self._publish(keys=self.keys, args=args)))
        self.version = max(self.version, version)
        return version

    async def resync(self, apply: Callable[[dict[str, Any]], None]) -> None:
        """Apply the fleet's current snapshot again, whatever its version (after a
        local change that lost a compare-and-set)."""
        await self.call(self._load(apply, force=True))

    async def _load(self, apply: Callable[[dict[str, Any]], None], force: bool = False) -> None:
        raw = await self.client.get(self.keys[1])
        if raw is None:
            return
        data = raw if isinstance(raw, bytes) else str(raw).encode()
        head, _, body = data.partition(b" ")
        version = int(head)
        if version <= self.version and not force:
            return
        self.version = version
        self.applied += 1
        try:
            apply(orjson.loads(body))
        except Exception:  # a bad snapshot must not stop the watch: the next one may do
            log.exception("could not apply the fleet's state version %d", version)

    async def watch(self, apply: Callable[[dict[str, Any]], None]) -> None:
        """Apply every newer snapshot, until cancelled (see the module docstring)."""
        connected = True
        while True:
            pubsub = self.client.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                await self._load(apply)
                if not connected:
                    log.info("fleet control: connected again, state version %d", self.version)
                    connected = True
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg is not None and msg.get("type") == "message":
                        await self._load(apply)
            except (RedisError, OSError) as exc:
                if connected:
                    log.warning("fleet control lost Redis (%s); retrying", exc)
                connected = False
                await asyncio.sleep(RETRY_S)
            finally:
                try:
                    await pubsub.aclose()
                except (RedisError, OSError):
                    pass
