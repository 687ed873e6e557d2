"""The embedded store: buckets, leases, pins and documents in this process (the default,
and the fail-open fallback). Leases need no expiry here: their holders live in this
process and release them in `finally`; a crash loses the store with them. Documents
expire on their own TTL and the oldest go first past `max_doc_bytes` characters."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import cachetools


@dataclass(slots=True)
class TokenBucket:
    """`rate` tokens a second, at most `burst` stored; `take` costs one token by default."""

    rate: float
    burst: float
    tokens: float = 0.0
    stamp: float = -1.0  # never used yet: full on first use

    def take(self, now: float, cost: float = 1.0, force: bool = False) -> float:
        """0 if `cost` tokens were taken, else seconds until they are there (see
        `edge.store.base.Store.take` for `force` and negative costs)."""
        if self.stamp < 0:
            self.tokens = self.burst
        else:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if force or self.tokens >= cost:
            self.tokens = min(self.burst, self.tokens - cost)
            return 0.0
        return (cost - self.tokens) / self.rate


class MemoryStore:
    """`edge.store.base.Store` in this process."""

    def __init__(
        self,
        pin_ttl_s: float,
        max_pins: int,
        timer: Callable[[], float] = time.monotonic,
        max_doc_bytes: int = 64 << 20,
    ) -> None:
        self.timer = timer
        self.buckets: dict[str, TokenBucket] = {}
        self.leases: dict[str, set[str]] = {}
        self.pins: cachetools.TTLCache[str, str] = cachetools.TTLCache(max_pins, pin_ttl_s, timer)
        # (expiry, doc) by key; sized by the documents' lengths.
        self.docs: cachetools.TLRUCache[str, tuple[float, str]] = cachetools.TLRUCache(
            max(1, max_doc_bytes), lambda _k, v, _now: v[0], timer, getsizeof=lambda v: len(v[1])
        )

    async def take(
        self, key: str, rate: float, burst: float, cost: float = 1.0, force: bool = False
    ) -> float:
        bucket = self.buckets.get(key)
        if bucket is None or bucket.rate != rate or bucket.burst != burst:
            bucket = self.buckets[key] = TokenBucket(rate, burst)
        return bucket.take(self.timer(), cost, force)

    async def acquire(self, key: str, lease: str, limit: int, ttl_s: float) -> bool:
        held = self.leases.setdefault(key, set())
        if lease in held:
            return True
        if len(held) >= limit:
            return False
        held.add(lease)
        return True

    async def release(self, key: str, lease: str) -> None:
        held = self.leases.get(key)
        if held is not None:
            held.discard(lease)
            if not held:
                del self.leases[key]

    async def admit(
        self, bucket: str, rate: float, burst: float, key: str, lease: str, limit: int, ttl_s: float
    ) -> tuple[float, bool]:
        # No await in between that could yield: one step for this process's other tasks.
        wait = await self.take(bucket, rate, burst)
        if wait > 0:
            return wait, False
        return 0.0, await self.acquire(key, lease, limit, ttl_s)

    async def finish(
        self, key: str, lease: str, bucket: str, rate: float, burst: float, cost: float
    ) -> None:
        await self.release(key, lease)
        await self.take(bucket, rate, burst, cost, force=True)

    def held(self, key: str) -> int:
        """Leases of `key` held now (tests, metrics)."""
        return len(self.leases.get(key, ()))

    def holding(self, key: str) -> int:
        return self.held(key)  # every holder is this process

    async def get_pin(self, key: str, ttl_s: float) -> str | None:
        pool = self.pins.get(key)
        if pool is not None:
            self.pins[key] = pool  # sliding: a used session lives on
        return pool

    async def put_pin(self, key: str, pool: str, ttl_s: float) -> None:
        self.pins[key] = pool

    async def get_doc(self, key: str) -> str | None:
        found = self.docs.get(key)
        return None if found is None else found[1]

    async def put_doc(self, key: str, doc: str, ttl_s: float) -> None:
        try:
            self.docs[key] = (self.timer() + ttl_s, doc)
        except ValueError:  # larger than the whole cache: not kept
            self.docs.pop(key, None)

    async def delete_doc(self, key: str) -> bool:
        return self.docs.pop(key, None) is not None

    async def close(self) -> None:
        return None
