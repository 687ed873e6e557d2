"""The shared store's interface (`Store`): token buckets on the store's clock, expiring
leases, a generation's two ends in one step each (`admit`, `finish`: one round trip),
session pins, and expiring documents (stored Responses). In this process (`memory`), in
Redis (`redis`), or chosen between when Redis fails (`guarded`). Keys are opaque: their
users choose them."""

from __future__ import annotations

from typing import Protocol


class StoreUnavailable(Exception):
    """The shared store cannot answer now (down, unreachable, too slow)."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Store(Protocol):
    """The operations every store implements (see the module docstring)."""

    async def take(
        self, key: str, rate: float, burst: float, cost: float = 1.0, force: bool = False
    ) -> float:
        """Take `cost` tokens from the bucket `key` (`rate` per second, `burst` deep, full
        when new). Returns 0 when taken, else the seconds until they would be there (and
        takes nothing). `force`: take them anyway, the bucket may go below zero (a debt
        the next takes wait for); a negative cost gives tokens back, up to `burst`."""
        ...

    async def acquire(self, key: str, lease: str, limit: int, ttl_s: float) -> bool:
        """Hold lease `lease` of `key` if fewer than `limit` are held; it lapses after
        `ttl_s` unless renewed (the store renews the leases its own holders keep)."""
        ...

    async def release(self, key: str, lease: str) -> None:
        """Let lease `lease` of `key` go (nothing if it is not held)."""
        ...

    async def admit(
        self, bucket: str, rate: float, burst: float, key: str, lease: str, limit: int, ttl_s: float
    ) -> tuple[float, bool]:
        """`take(bucket, rate, burst)` and, only if that took the token, `acquire(key,
        lease, limit, ttl_s)`, as one atomic step. Returns (the take's wait, whether the
        lease is held): (> 0, False) refused by the rate, nothing taken and no lease
        tried; (0, False) refused by the slots, the token stays spent (the rate counts
        every request, refused ones included); (0, True) admitted."""
        ...

    async def finish(
        self, key: str, lease: str, bucket: str, rate: float, burst: float, cost: float
    ) -> None:
        """`release(key, lease)` and `take(bucket, rate, burst, cost, force=True)` (a
        settlement) as one step."""
        ...

    def holding(self, key: str) -> int:
        """Leases of `key` this process holds now."""
        ...

    async def get_pin(self, key: str, ttl_s: float) -> str | None:
        """The pool session `key` is pinned to, its lifetime renewed to `ttl_s`."""
        ...

    async def put_pin(self, key: str, pool: str, ttl_s: float) -> None:
        """Pin session `key` to `pool` for `ttl_s`."""
        ...

    async def get_doc(self, key: str) -> str | None:
        """The document `key` (JSON text), or None (never put, expired, deleted, evicted)."""
        ...

    async def put_doc(self, key: str, doc: str, ttl_s: float) -> None:
        """Keep document `key` for `ttl_s`."""
        ...

    async def delete_doc(self, key: str) -> bool:
        """Drop document `key`; whether it was there."""
        ...

    async def close(self) -> None:
        """Stop background work and connections."""
        ...
