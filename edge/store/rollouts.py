"""The fleet's rollouts in Redis (`edge.release.fleet_rollouts`): a hash (`version`,
`active`, `body`) and the owner's lease (`<prefix>:rollouts:owner`, expiring `ttl` after
its last renewal). `tick` takes, renews or drops the lease and returns the body only when
its version changed; `save` is a compare-and-set on the version (and the owner's lease)."""

from __future__ import annotations

from typing import Any

from edge.store.connection import RedisConnection

# KEYS board, owner; ARGV me, ttl_ms, the version the caller has.
TICK = """
local v = redis.call('HMGET', KEYS[1], 'version', 'active')
local version = tonumber(v[1] or '0')
local owner = 0
if v[2] and v[2] ~= '' then
  local holder = redis.call('GET', KEYS[2])
  if (not holder) or holder == ARGV[1] then
    redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
    owner = 1
  end
elseif redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
end
local body = ''
if version ~= tonumber(ARGV[3]) then body = redis.call('HGET', KEYS[1], 'body') or '' end
return {owner, version, body}
"""

# KEYS board, owner; ARGV body, active, expected version, me ('': any caller).
SAVE = """
if ARGV[4] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[4] then return 0 end
local version = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if version ~= tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], 'version', version + 1, 'active', ARGV[2], 'body', ARGV[1])
return version + 1
"""


class RolloutBoard(RedisConnection):
    """The rollouts' document and owner lease in Redis (see the module docstring)."""

    def __init__(self, url: str, timeout_s: float, prefix: str = "sluice") -> None:
        super().__init__(url, timeout_s)
        self.keys = [f"{prefix}:rollouts", f"{prefix}:rollouts:owner"]
        self.seq_key = f"{prefix}:rollouts:seq"
        self._tick = self.client.register_script(TICK)
        self._save = self.client.register_script(SAVE)

    async def tick(self, me: str, ttl_s: float, known: int) -> tuple[bool, int, bytes | None]:
        """(whether `me` holds the lease, the version, the body if not `known`)."""
        args: list[Any] = [me, max(1, int(ttl_s * 1000)), known]
        owner, version, body = await self.call(self._tick(keys=self.keys, args=args))
        version = int(version)
        return bool(owner), version, (bytes(body) if version != known else None)

    async def save(self, body: bytes, active: str, expect: int, me: str = "") -> int:
        """The new version, or 0 if the document (or the lease, for `me`) moved on."""
        args: list[Any] = [body, active, expect, me]
        return int(await self.call(self._save(keys=self.keys, args=args)))

    async def owner(self) -> str | None:
        raw = await self.call(self.client.get(self.keys[1]))
        return raw.decode() if isinstance(raw, bytes) else raw

    async def next_seq(self) -> int:
        return int(await self.call(self.client.incr(self.seq_key)))
