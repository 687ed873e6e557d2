"""The windows judges read: `LocalWindows` (this process's) or `FleetWindows` (`--store-url`:
outcomes added to per-second Redis buckets every `FLUSH_S`, latencies in `BIN_FACTOR` log
bins, so a percentile is within ±2.5 %). Redis failing, or an exchange older than
`STALE_S`: this process's own windows, logged once each way."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from edge.obs.outcomes import MAX_WINDOW_S, Outcome, WindowStats
from edge.routing.registry import PoolRegistry
from edge.store.base import StoreUnavailable
from edge.store.windows import Bucket, WindowCounters

log = logging.getLogger("sluice.edge")
FLUSH_S = 0.25
SETTLE_S = 5  # a bucket this old has all its outcomes (flushes lag by FLUSH_S)
STALE_S = 1.0
KEEP_S = MAX_WINDOW_S + 60  # buckets' ttl in Redis
BIN_FACTOR = 1.05
BIN_LOW_S = 1e-4  # latencies below are counted in bin 0


def latency_bin(seconds: float) -> int:
    return max(0, int(math.log(max(seconds, BIN_LOW_S) / BIN_LOW_S) / math.log(BIN_FACTOR)))


def bin_value(index: int) -> float:
    return BIN_LOW_S * BIN_FACTOR ** (index + 0.5)


def bin_percentile(bins: Counter[int], q: float) -> float | None:
    """Nearest-rank percentile of binned values (None when empty)."""
    total = sum(bins.values())
    if not total:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for index in sorted(bins):
        seen += bins[index]
        if seen >= rank:
            return bin_value(index)
    return None  # unreachable


def counts(entries: list[Outcome], offset: float) -> dict[int, dict[str, int]]:
    """Outcomes (monotonic time, is_error, ttft, itl) as per-second bucket fields."""
    out: dict[int, dict[str, int]] = {}
    for t, error, ttft, itl in entries:
        fields = out.setdefault(math.floor(t + offset), {})
        fields["n"] = fields.get("n", 0) + 1
        if error:
            fields["e"] = fields.get("e", 0) + 1
        if ttft is not None:
            name = f"t{latency_bin(ttft)}"
            fields[name] = fields.get(name, 0) + 1
        if itl is not None:
            name = f"i{latency_bin(itl)}"
            fields[name] = fields.get(name, 0) + 1
    return out


def stats(buckets: list[dict[str, int]]) -> WindowStats:
    """The window that the buckets make together."""
    requests = errors = 0
    ttft: Counter[int] = Counter()
    itl: Counter[int] = Counter()
    for fields in buckets:
        for name, value in fields.items():
            if name == "n":
                requests += value
            elif name == "e":
                errors += value
            elif name[0] == "t":
                ttft[int(name[1:])] += value
            elif name[0] == "i":
                itl[int(name[1:])] += value
    return WindowStats(
        requests,
        errors,
        bin_percentile(ttft, 0.5),
        bin_percentile(ttft, 0.99),
        bin_percentile(itl, 0.99),
    )


class Windows(Protocol):
    """What judges read: a pool's window of `seconds` up to `now` (monotonic)."""

    def window(self, pool: str, seconds: float, now: float) -> WindowStats: ...

    def nth_since(self, pool: str, since: float, n: int) -> float | None: ...


class LocalWindows:
    """This process's own windows."""

    def __init__(self, registry: PoolRegistry) -> None:
        self.registry = registry

    def window(self, pool: str, seconds: float, now: float) -> WindowStats:
        return self.registry.pool_metrics(pool).window(seconds, now)

    def nth_since(self, pool: str, since: float, n: int) -> float | None:
        return self.registry.pool_metrics(pool).nth_since(since, n)


class FleetWindows:
    """The fleet's windows (see the module docstring). `span()`: how many seconds back
    the judges need now (0: none; the counts are still added)."""

    def __init__(
        self,
        registry: PoolRegistry,
        counters: WindowCounters,
        span: Callable[[], float],
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self.counters = counters
        self.span = span
        self.wall = wall
        self.mono = mono
        self.local = LocalWindows(registry)
        self.cache: dict[str, dict[int, dict[str, int]]] = {}
        self.fresh_at = -math.inf  # monotonic time of the last good exchange
        self.up = True
        self.flushes = 0
        registry.collect = True
        for metrics in registry.metrics.values():
            metrics.pending = []

    def _offset(self) -> float:
        return self.wall() - self.mono()

    @property
    def fresh(self) -> bool:
        return self.mono() - self.fresh_at <= STALE_S

    def _buckets(self, pool: str, first: int, last: int) -> list[dict[str, int]]:
        have = self.cache.get(pool, {})
        return [have[b] for b in range(first, last + 1) if b in have]

    def window(self, pool: str, seconds: float, now: float) -> WindowStats:
        # Buckets are unix seconds (NTP keeps the replicas' clocks): a window includes its
        # first, partial second, so it spans at most one second more than asked.
        if not self.fresh:
            return self.local.window(pool, seconds, now)
        offset = self._offset()
        start = max(now - seconds, self.registry.pool_metrics(pool).window_start)
        first = math.floor(start + offset)
        return stats(self._buckets(pool, first, math.floor(now + offset)))

    def nth_since(self, pool: str, since: float, n: int) -> float | None:
        if not self.fresh:
            return self.local.nth_since(pool, since, n)
        offset, now = self._offset(), self.mono()
        have = self.cache.get(pool, {})
        seen = 0
        for b in range(math.floor(since + offset), math.floor(now + offset) + 1):
            seen += have.get(b, {}).get("n", 0)
            if n > 0 and seen >= n:
                return min(b + 1 - offset, now)
        return None

    async def exchange(self) -> None:
        """Add this process's new outcomes; read what the judges need (one round trip)."""
        offset = self._offset()
        add: dict[Bucket, dict[str, int]] = {}
        for name, metrics in list(self.registry.metrics.items()):
            entries, metrics.pending = metrics.pending or [], []
            for b, fields in counts(entries, offset).items():
                add[(name, b)] = fields
        span = min(self.span(), MAX_WINDOW_S)
        now = math.floor(self.mono() + offset)
        read: list[Bucket] = []
        if span > 0:
            first = math.floor(now - span)
            for pool in self.registry.pools:
                have = self.cache.setdefault(pool, {})
                for b in [b for b in have if b < first]:
                    del have[b]
                settled = now - SETTLE_S
                read += [(pool, b) for b in range(first, now + 1) if b >= settled or b not in have]
        if not add and not read:
            self.fresh_at = self.mono()
            return
        got = await self.counters.exchange(add, read, KEEP_S)
        for (pool, b), fields in zip(read, got, strict=True):
            self.cache.setdefault(pool, {})[b] = fields
        for pool in [p for p in self.cache if p not in self.registry.pools]:
            del self.cache[pool]
        self.fresh_at = self.mono()
        self.flushes += 1

    async def run(self) -> None:
        """`exchange` every FLUSH_S until cancelled (a task of the registry)."""
        while True:
            await asyncio.sleep(FLUSH_S)
            try:
                await self.exchange()
            except StoreUnavailable as exc:
                if self.up:
                    log.warning("fleet windows: %s; judging by this process's windows", exc)
                self.up = False
                continue
            except Exception:  # a bug here must not stop the flushing for good
                log.exception("fleet windows: exchange failed")
                continue
            if not self.up:
                log.info("fleet windows: Redis answers again; judging by the fleet's windows")
                self.up = True
