"""A shared store with a failure rule: a `StoreUnavailable` marks it down (operations skip
Redis) until a ping every `PROBE_S` is answered (`_watch`); no restart. Open: this process's
limits, a key's streams within this process's part of the limit (`presence.py`), so it holds
across replicas, and its streams added to Redis once it answers; closed: `StoreUnavailable`
(503). Pins and documents fall back to this process in both."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from edge.obs.prom import Exposition
from edge.store.base import StoreUnavailable
from edge.store.connection import cancel_and_wait
from edge.store.memory import MemoryStore
from edge.store.redis import RedisStore

log = logging.getLogger("sluice.edge")
RETRY_S = 0.5  # how long a failed shared store is left alone before the next try
PROBE_S = 0.05  # how often a store marked down is pinged


class Guarded:
    """`edge.store.base.Store` over a shared store and a local fallback (module doc)."""

    def __init__(
        self,
        shared: RedisStore,
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
        self._probe: asyncio.Task[None] | None = None

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
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        """While the store is down: ping it; its first answer ends the down time (before
        `retry_s` is out), each failed ping keeps it down (requests skip the dead store
        rather than each waiting out the store timeout)."""
        while not self.up:
            await asyncio.sleep(PROBE_S)
            try:
                await self.shared.ping()
            except StoreUnavailable:
                self.down_until = max(self.down_until, self.timer() + self.retry_s)
                continue
            self.down_until = 0.0
            log.info("shared store answers again")

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
            self._held_locally(key, lease, ttl_s)
        return held

    def _held_locally(self, key: str, lease: str, ttl_s: float) -> None:
        self._local_leases.add((key, lease))
        self.shared.hold_later(key, lease, ttl_s)  # into Redis once it answers

    def _local_limit(self, key: str, limit: int) -> int:
        """The slots left to this process while the shared store fails: its part of
        `limit` less the leases it holds in Redis (its streams still running; those
        held here are counted by the local store)."""
        in_redis = self.shared.holding(key) - self.local.holding(key)
        return max(0, self.shared.outage_limit(key, limit) - in_redis)

    def holding(self, key: str) -> int:
        return self.shared.holding(key)  # those held here too (`_held_locally`)

    async def release(self, key: str, lease: str) -> None:
        if (key, lease) in self._local_leases:
            self._local_leases.discard((key, lease))
            await self.local.release(key, lease)
            if not self.up:  # never in Redis, or it lapses there by its ttl
                self.shared.forget(key, lease)
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
            self._held_locally(key, lease, ttl_s)
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

    async def run(self) -> None:
        """The background work (the lifespan's task): this process's presence."""
        await self.shared.run()

    async def close(self) -> None:
        if self._probe is not None:
            await cancel_and_wait(self._probe, 1.0)
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
            "sluice_edge_store_processes",
            "gauge",
            "Edge processes sharing the store at the last look (each one's part of a key's "
            "stream limit while the store fails).",
            [("", self.shared.presence.replicas)],
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
