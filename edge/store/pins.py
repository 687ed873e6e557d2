"""Session pins in a store: `edge.routing.pinning.SessionStore` over `edge.store.base.Store`,
so header and `user` sessions keep their pool on every edge process and replica."""

from __future__ import annotations

from edge.store.base import Store


class StorePins:
    """A `SessionStore` whose entries live `ttl_s` from their last use, in `store`."""

    def __init__(self, store: Store, ttl_s: float) -> None:
        self.store = store
        self.ttl_s = ttl_s

    async def get(self, key: str) -> str | None:
        return await self.store.get_pin(key, self.ttl_s)

    async def put(self, key: str, pool: str) -> None:
        await self.store.put_pin(key, pool, self.ttl_s)
