"""The registry's lines for the edge's /metrics: pool weights and windows, workers'
in-flight counts and routability, outcomes and placement decisions (read at scrape time)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from edge.obs import outcomes
from edge.obs.prom import Exposition, labels
from edge.routing import placement

if TYPE_CHECKING:
    from edge.routing.registry import PoolRegistry


def render_registry(registry: PoolRegistry) -> str:
    """Per-pool and per-worker lines for the edge's /metrics."""
    now = time.monotonic()
    out = Exposition()
    outcomes.expose(out, registry.metrics)
    pools = list(registry.pools.values())
    windows = [
        (p, registry.pool_metrics(p.name).window(p.rollback.window_s if p.rollback else 60.0, now))
        for p in pools
    ]
    out.family(
        "sluice_edge_pool_weight",
        "gauge",
        "Share of new traffic (relative to the other pools).",
        [(labels(pool=p.name), p.weight) for p in pools],
    )
    out.family(
        "sluice_edge_pool_error_ratio",
        "gauge",
        "Failed attempts / attempts over the pool's window (rollback window, else 60 s).",
        [(labels(pool=p.name), w.error_rate) for p, w in windows],
    )
    out.family(
        "sluice_edge_pool_ttft_p99_seconds",
        "gauge",
        "p99 time to first token over the pool's window.",
        [(labels(pool=p.name), w.ttft_p99_s) for p, w in windows if w.ttft_p99_s],
    )
    workers = [(labels(pool=w.pool, worker=w.address, id=w.key), w) for w in registry.workers]
    out.family(
        "sluice_edge_worker_in_flight",
        "gauge",
        "This edge's calls on a worker now.",
        [(lbl, w.in_flight) for lbl, w in workers],
    )
    out.family(
        "sluice_edge_worker_routable",
        "gauge",
        "1 if the worker gets new requests (SERVING, in its pool, not marked failed).",
        [(lbl, int(w.routable(now))) for lbl, w in workers],
    )
    placement.expose(out, [(p.name, p.placement) for p in pools], registry.workers)
    return out.text()
