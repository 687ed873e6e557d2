"""Per-pool, per-second outcome counters in Redis (`<prefix>:window:<pool>:<unix second>`;
what the fields count is `edge.release.windows`'s business): `exchange`, one pipelined
round trip, adds this process's counts and reads back the buckets asked for. Failures
raise `StoreUnavailable`."""

from __future__ import annotations

from typing import Any

from edge.store.connection import RedisConnection

Bucket = tuple[str, int]  # (pool, unix second)


class WindowCounters(RedisConnection):
    """Per-pool, per-second outcome counters in Redis (see the module docstring)."""

    def __init__(self, url: str, timeout_s: float, prefix: str = "sluice") -> None:
        super().__init__(url, timeout_s, decode_responses=True)
        self.prefix = prefix

    def key(self, bucket: Bucket) -> str:
        return f"{self.prefix}:window:{bucket[0]}:{bucket[1]}"

    async def exchange(
        self, add: dict[Bucket, dict[str, int]], read: list[Bucket], ttl_s: float
    ) -> list[dict[str, int]]:
        """Add `add`'s counts, then read the buckets `read` (one round trip)."""
        pipe = self.client.pipeline(transaction=False)
        ttl = max(1, int(ttl_s))
        for bucket, fields in add.items():
            key = self.key(bucket)
            for name, value in fields.items():
                pipe.hincrby(key, name, value)
            pipe.expire(key, ttl)
        for bucket in read:
            pipe.hgetall(self.key(bucket))
        results: list[Any] = await self.call(pipe.execute())
        got = results[len(results) - len(read) :] if read else []
        return [{k: int(v) for k, v in h.items()} for h in got]
