"""A shared store with a failure rule: a `StoreUnavailable` marks it down for `retry_s`
(operations meanwhile skip Redis), then the next tries it again, so recovery needs no
restart. Open: this process's limits, counting the streams it holds in the shared store
too (one replica never runs more than a limit alone); closed: `StoreUnavailable` (503).
Pins and documents fall back to this process in both; a lease is released where it was
taken."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from edge.obs.prom import Exposition
from edge.store.base import Store, StoreUnavailable
from edge.store.memory import MemoryStore

log = logging.getLogger("sluice.edge")
RETRY_S = 0.5  # how long a failed shared store is left alone before the next try


class Guarded:
    """`edge.store.base.Store` over a shared store and a local fallback (module doc)."""

    def __init__(
        self,
        shared: Store,
        local: MemoryStore,
        fail_open: bool,
        retry_s: float = RETRY_S,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self.shared = shared
        self.local = local
        self.fail_open = fail_open
        self.retry_s = retry_s
        self.timer = timer
        self.down_until = 0.0  # the shared store is skipped until then
        self.failures = 0  # operations the shared store failed (metrics)
        self.fallbacks = 0  # operations answered by the fallback rule instead (metrics)
        self._local_leases: set[tuple[str, str]] = set()

    @property
    def up(self) -> bool:
        return self.timer() >= self.down_until

    def _down(self, exc: StoreUnavailable) -> None:
        self.failures += 1
        if self.up:
            log.warning(
                "shared store failed (%s): failing %s for %.1f s",
                exc,
                "open" if self.fail_open else "closed",
                self.retry_s,
            )
        self.down_until = self.timer() + self.retry_s

    def _refuse(self) -> StoreUnavailable:
        wait = max(self.down_until - self.timer(), 0.0) or self.retry_s
        return StoreUnavailable("the shared store is unavailable", retry_after_s=wait)

    async def take(
        self, key: str, rate: float, burst: float, cost: float = 1.0, force: bool = False
    ) -> float:
        if self.up:
            try:
                return await self.shared.take(key, rate, burst, cost, force)
            except StoreUnavailable as exc:
                self._down(exc)
        self.fallbacks += 1
        if force:  # a settlement: nothing to refuse, keep it local
            return await self.local.take(key, rate, burst, cost, force)
        if not self.fail_open:
            raise self._refuse()
        return await self.local.take(key, rate, burst, cost, force)

    async def acquire(self, key: str, lease: str, limit: int, ttl_s: float) -> bool:
        if self.up:
            try:
                return await self.shared.acquire(key, lease, limit, ttl_s)
            except StoreUnavailable as exc:
                self._down(exc)
        self.fallbacks += 1
        if not self.fail_open:
            raise self._refuse()
        held = await self.local.acquire(key, lease, self._local_limit(key, limit), ttl_s)
        if held:
            self._local_leases.add((key, lease))
        return held

    def _local_limit(self, key: str, limit: int) -> int:
        """The slots left to this process while the shared store fails: `limit` less the
        leases it holds there (its streams still running)."""
        return max(0, limit - self.shared.holding(key))

    def holding(self, key: str) -> int:
        return self.shared.holding(key) + self.local.holding(key)

    async def release(self, key: str, lease: str) -> None:
        if (key, lease) in self._local_leases:
            self._local_leases.discard((key, lease))
            await self.local.release(key, lease)
            return
        try:
            await self.shared.release(key, lease)
        except StoreUnavailable as exc:
            self._down(exc)  # it lapses by its ttl

    async def admit(
        self, bucket: str, rate: float, burst: float, key: str, lease: str, limit: int, ttl_s: float
    ) -> tuple[float, bool]:
        if self.up:
            try:
                return await self.shared.admit(bucket, rate, burst, key, lease, limit, ttl_s)
            except StoreUnavailable as exc:
                self._down(exc)
        self.fallbacks += 1
        if not self.fail_open:
            raise self._refuse()
        limit = self._local_limit(key, limit)
        wait, held = await self.local.admit(bucket, rate, burst, key, lease, limit, ttl_s)
        if held:
            self._local_leases.add((key, lease))
        return wait, held

    async def finish(
        self, key: str, lease: str, bucket: str, rate: float, burst: float, cost: float
    ) -> None:
        if self.up and (key, lease) not in self._local_leases:
            try:
                await self.shared.finish(key, lease, bucket, rate, burst, cost)
                return
            except StoreUnavailable as exc:
                self._down(exc)  # the lease lapses by its ttl; the settlement stays local
                self.fallbacks += 1
                await self.local.take(bucket, rate, burst, cost, force=True)
                return
        # A local lease, or the shared store down: each part where `release` and
        # `take` send it.
        await self.release(key, lease)
        await self.take(bucket, rate, burst, cost, force=True)

    async def get_pin(self, key: str, ttl_s: float) -> str | None:
        if self.up:
            try:
                return await self.shared.get_pin(key, ttl_s)
            except StoreUnavailable as exc:
                self._down(exc)
        return await self.local.get_pin(key, ttl_s)

    async def put_pin(self, key: str, pool: str, ttl_s: float) -> None:
        if self.up:
            try:
                await self.shared.put_pin(key, pool, ttl_s)
                return
            except StoreUnavailable as exc:
                self._down(exc)
        await self.local.put_pin(key, pool, ttl_s)

    async def get_doc(self, key: str) -> str | None:
        if self.up:
            try:
                return await self.shared.get_doc(key)
            except StoreUnavailable as exc:
                self._down(exc)
        return await self.local.get_doc(key)

    async def put_doc(self, key: str, doc: str, ttl_s: float) -> None:
        if self.up:
            try:
                await self.shared.put_doc(key, doc, ttl_s)
                return
            except StoreUnavailable as exc:
                self._down(exc)
        await self.local.put_doc(key, doc, ttl_s)

    async def delete_doc(self, key: str) -> bool:
        gone = await self.local.delete_doc(key)  # a fallback copy goes too
        if self.up:
            try:
                return await self.shared.delete_doc(key) or gone
            except StoreUnavailable as exc:
                self._down(exc)
        return gone

    async def close(self) -> None:
        await self.shared.close()

    def render_metrics(self) -> str:
        out = Exposition()
        out.family(
            "sluice_edge_store_up",
            "gauge",
            "1 while the shared store answers (0: failing open or closed, see the mode).",
            [("", int(self.up))],
        )
        out.family(
            "sluice_edge_store_failures_total",
            "counter",
            "Operations the shared store failed (refused, timed out).",
            [("", self.failures)],
        )
        out.family(
            "sluice_edge_store_fallbacks_total",
            "counter",
            "Operations answered by the failure mode instead of the shared store.",
            [("", self.fallbacks)],
        )
        return out.text()
