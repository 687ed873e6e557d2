"""Automatic canary rollback: a pool whose window breaks its `rollback` bounds (its error
rate above the rest of the fleet's, its p99 TTFT) drains, once, logged and counted. With a
shared store it is decided once for the fleet (`decide`: a compare-and-set on the control
version). Absolute bounds; rollout plans (`edge.release.rollouts`) judge relative ones."""

from __future__ import annotations

import asyncio
import logging
import time

from edge.obs.outcomes import WindowStats
from edge.release.windows import LocalWindows, Windows
from edge.routing.fleet import FleetSync, snapshot
from edge.routing.pools import RollbackSpec
from edge.routing.registry import PoolRegistry
from edge.store.base import StoreUnavailable

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


def verdicts(
    registry: PoolRegistry, windows: Windows | None = None, now: float | None = None
) -> list[tuple[str, str]]:
    """Every watched pool with weight > 0 that must roll back now, and why."""
    t = time.monotonic() if now is None else now
    windows = windows or LocalWindows(registry)
    found: list[tuple[str, str]] = []
    for pool in list(registry.pools.values()):
        spec = pool.rollback
        if spec is None or pool.weight <= 0:
            continue
        stats = windows.window(pool.name, spec.window_s, t)
        others = [windows.window(p, spec.window_s, t) for p in registry.pools if p != pool.name]
        rest = WindowStats(
            sum(o.requests for o in others), sum(o.errors for o in others), None, None
        )
        reason = verdict(spec, stats, rest)
        if reason is not None:
            found.append((pool.name, reason))
    return found


def roll_back(
    registry: PoolRegistry, name: str, reason: str, rolled: dict[str, object] | None = None
) -> None:
    """Weight 0 and drain (its pinned sessions move on too), logged and counted."""
    pool = registry.pool(name)
    log.warning("canary rollback: pool %s to weight 0: %s", name, reason)
    pool.rolled_back = rolled or {"at": time.time(), "reason": reason, "weight": pool.weight}
    registry.drain(name, "rolled_back")
    registry.pool_metrics(name).rollbacks += 1


def check(registry: PoolRegistry, now: float | None = None) -> list[str]:
    """Judge every watched pool once by this process's windows; roll back the failing."""
    rolled = []
    for name, reason in verdicts(registry, None, now):
        roll_back(registry, name, reason)
        rolled.append(name)
    return rolled


async def decide(registry: PoolRegistry, fleet: FleetSync, name: str, reason: str) -> bool:
    """Roll `name` back for the whole fleet, once: the fleet's state with it drained is
    published only if no other change (another process's rollback of it, say) came since
    this process applied the last one. True when this process did it."""
    pool = registry.pool(name)
    doc = snapshot(registry)
    entry = next(p for p in doc["pools"] if p["name"] == name)
    rolled = {"at": time.time(), "reason": reason, "weight": pool.weight}
    entry.update(weight=0.0, draining="rolled_back", rolled_back=rolled)
    try:
        won = await fleet.publish_if(doc)
    except StoreUnavailable as exc:
        log.warning("canary rollback of %s not published (%s): this process only", name, exc)
        roll_back(registry, name, reason)
        return True
    if won:
        roll_back(registry, name, reason, rolled)
    else:
        log.info("canary rollback of %s: the fleet changed first, judging again", name)
    return won


async def watch(
    registry: PoolRegistry, windows: Windows | None = None, fleet: FleetSync | None = None
) -> None:
    """Judge every `CHECK_INTERVAL_S` (started by the bootstrap's lifespan, as a task of
    the registry), by `windows` (default: this process's); with `fleet`, a rollback is
    decided once for every process of every replica (`decide`)."""
    while True:
        await asyncio.sleep(CHECK_INTERVAL_S)
        try:
            for name, reason in verdicts(registry, windows):
                if fleet is None:
                    roll_back(registry, name, reason)
                else:
                    await decide(registry, fleet, name, reason)
        except Exception:  # a bug here must not stop routing
            log.exception("canary check failed")


def span(registry: PoolRegistry) -> float:
    """The longest window the watched pools are judged over now (seconds, 0: none)."""
    return max(
        (p.rollback.window_s for p in registry.pools.values() if p.rollback and p.weight > 0),
        default=0.0,
    )
