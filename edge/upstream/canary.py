"""Automatic canary rollback: a pool whose recent outcomes break its `rollback` bounds gets
weight 0 and drains (its pinned sessions move on), once, with a log line and a count in
/metrics (`sluice_edge_pool_rollbacks_total`). Rollout plans (`edge.upstream.rollouts`)
judge a canary against the stable pool step by step; these bounds are absolute.

Judged every `CHECK_INTERVAL_S` over the pool's own window (`window_s`, at least
`min_requests` outcomes): its error rate *in excess of the rest of the fleet's* over the
same window against `max_error_rate`, its p99 TTFT against `max_p99_ttft_s`. A weight set
again by an operator starts a fresh window. In-flight streams are never touched.

With a shared store the process that rolls a pool back publishes the fleet's new state
(`on_rollback`, `edge.upstream.fleet`): every process of every replica drains the pool
too, whatever its own window says. Each process still judges its own window only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from edge.upstream.outcomes import WindowStats
from edge.upstream.pools import RollbackSpec
from edge.upstream.registry import PoolRegistry

log = logging.getLogger("sluice.edge")
CHECK_INTERVAL_S = 0.25


def verdict(spec: RollbackSpec, pool: WindowStats, rest: WindowStats) -> str | None:
    """Why the pool must roll back now, or None. Pure."""
    if pool.requests < spec.min_requests:
        return None
    if spec.max_error_rate is not None:
        # The rest of the fleet only sets a baseline once it has enough outcomes itself.
        baseline = rest.error_rate if rest.requests >= spec.min_requests else 0.0
        excess = pool.error_rate - baseline
        if excess > spec.max_error_rate:
            return (
                f"error rate {pool.error_rate:.1%} over {pool.requests} requests "
                f"(rest of fleet {baseline:.1%}) exceeds the bound by more than "
                f"{spec.max_error_rate:.1%}"
            )
    if spec.max_p99_ttft_s is not None and pool.ttft_p99_s is not None:
        if pool.ttft_p99_s > spec.max_p99_ttft_s:
            return f"p99 TTFT {pool.ttft_p99_s * 1000:.0f} ms > {spec.max_p99_ttft_s * 1000:.0f} ms"
    return None


def check(registry: PoolRegistry, now: float | None = None) -> list[str]:
    """Judge every watched pool with weight > 0 once; roll back the failing ones."""
    t = time.monotonic() if now is None else now
    rolled: list[str] = []
    for pool in list(registry.pools.values()):
        spec = pool.rollback
        if spec is None or pool.weight <= 0:
            continue
        stats = registry.pool_metrics(pool.name).window(spec.window_s, t)
        others = [registry.pool_metrics(p).window(spec.window_s, t) for p in registry.pools]
        rest = WindowStats(
            sum(o.requests for o in others) - stats.requests,
            sum(o.errors for o in others) - stats.errors,
            None,
            None,
        )
        reason = verdict(spec, stats, rest)
        if reason is None:
            continue
        log.warning("canary rollback: pool %s to weight 0: %s", pool.name, reason)
        pool.rolled_back = {"at": time.time(), "reason": reason, "weight": pool.weight}
        registry.drain(pool.name, "rolled_back")  # its pinned sessions move on too
        registry.pool_metrics(pool.name).rollbacks += 1
        rolled.append(pool.name)
    return rolled


async def watch(
    registry: PoolRegistry, on_rollback: Callable[[], Awaitable[object]] | None = None
) -> None:
    """Run `check` forever (started by the bootstrap's lifespan, as a task of the registry);
    after a rollback, `on_rollback` (the fleet's publish)."""
    while True:
        await asyncio.sleep(CHECK_INTERVAL_S)
        try:
            if check(registry) and on_rollback is not None:
                await on_rollback()
        except Exception:  # a bug here (or the store failing) must not stop routing
            log.exception("canary check failed")
