"""The worker within one pool (`Placement`): a keyed request goes to its rendezvous worker,
a keyless one by the pool's policy (`session`, `least_load`, `random`, `cache_aware`,
`kv_aware`). `cache_aware` credits the chosen worker with the prompt's blocks (keyed
requests too); `kv_aware` reads what caches hold from their events (`kvaware.py`), and
without token ids or live events places as `cache_aware` does."""

from __future__ import annotations

import random
from collections.abc import Sequence

from edge.config import RoutingConfig
from edge.obs.prom import Exposition, labels
from edge.routing import kvaware
from edge.routing.prefix import CHARS_PER_TOKEN, INDEX_HEADROOM, PrefixIndex, Prompt
from edge.routing.scores import (
    CacheAware,
    cache_aware,
    holder_first,
    hrw,
    least_loaded,
    two_choices,
)
from edge.upstream.worker import Worker


class Placement:
    """One pool's worker choice (module docstring)."""

    def __init__(
        self,
        policy: str = "",
        opts: RoutingConfig | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.own_policy = policy  # "": the edge's --routing-policy
        self.opts = opts or RoutingConfig()
        self._rng = rng or random.Random()
        o = self.opts
        self._params = CacheAware(o.cache_load_weight, o.cache_balance_abs, o.cache_balance_rel)
        self.index = PrefixIndex()
        self.memo = kvaware.HashMemo()  # kv_aware's block hashes of earlier turns
        self.decisions: dict[str, int] = {}  # cache_aware picks by reason

    @property
    def policy(self) -> str:
        return self.own_policy or self.opts.policy

    def choose(self, workers: Sequence[Worker], key: str, prompt: Prompt | None) -> Worker:
        """The worker for a new generation among `workers` (candidates, not empty)."""
        policy = self.policy
        if policy == "kv_aware":  # the registry follows its workers' events
            if prompt is None:  # not a generation's pick (Tokenize, render): by load
                return workers[least_loaded([w.load for w in workers], self._rng)]
            ids = prompt.token_ids
            if not key and ids is not None and kvaware.usable([w.cache for w in workers]):
                return self._kv_aware(workers, ids)
            policy = "cache_aware"
        blocks: list[int] = []
        if policy == "cache_aware" and prompt is not None:
            blocks = prompt.blocks(self.opts.prefix_block_chars)
        if key:
            worker = hrw(key, workers, lambda w: w.address)
        elif policy == "cache_aware":
            hits = self.index.match(blocks, workers)
            loads = [w.load for w in workers]
            i, reason = cache_aware(hits, len(blocks), loads, self._params, self._rng)
            self.decisions[reason] = self.decisions.get(reason, 0) + 1
            worker = workers[i]
        elif policy == "least_load":
            worker = workers[least_loaded([w.load for w in workers], self._rng)]
        elif policy == "random":
            worker = self._rng.choice(workers)
        else:
            worker = two_choices(workers, lambda w: w.load, self._rng)
        if blocks:
            self.index.add(blocks, worker.key, worker.epoch, self.capacity(worker))
        return worker

    def _kv_aware(self, workers: Sequence[Worker], ids: Sequence[int]) -> Worker:
        """The longest held prefix's worker, within the load slack (`scores.holder_first`)."""
        feeds = [w.cache for w in workers]
        loads = [w.load for w in workers]
        hits = kvaware.held_prefix(ids, feeds, self.memo, longest=True)
        free = [_has_slot(w) for w in workers]
        i, reason = holder_first(hits, loads, free, self.opts.kv_load_slack, self._rng)
        self.decisions[f"kv_{reason}"] = self.decisions.get(f"kv_{reason}", 0) + 1
        return workers[i]

    def capacity(self, worker: Worker) -> int:
        """Blocks the index holds for `worker`: about its KV cache in characters, when known
        (`prefix.INDEX_HEADROOM`)."""
        tokens = worker.kv_cache_tokens()
        if not tokens:
            return self.opts.prefix_index_blocks
        chars = tokens * CHARS_PER_TOKEN * INDEX_HEADROOM
        return max(1, chars // self.opts.prefix_block_chars)

    def forget(self, worker: Worker) -> None:
        """`worker` left the pool."""
        self.index.forget(worker.key)


def _has_slot(worker: Worker) -> bool:
    """A batch slot is free for one more generation (unknown: yes)."""
    r = worker.reported
    return r is None or not r.max_running or worker.load < r.max_running


def expose(
    out: Exposition, pools: Sequence[tuple[str, Placement]], workers: Sequence[Worker]
) -> None:
    """The placement lines of the edge's /metrics: worker load as routing sees it, pushed
    hit rates, and cache_aware decisions by reason."""
    lbls = [(labels(pool=w.pool, worker=w.address, id=w.key), w) for w in workers]
    out.family(
        "sluice_edge_worker_load",
        "gauge",
        "Generations on a worker as this edge knows: its last load push + this edge's since.",
        [(lbl, w.load) for lbl, w in lbls],
    )
    out.family(
        "sluice_edge_worker_prefix_cache_hit_ratio",
        "gauge",
        "Prompt tokens served from the worker's prefix cache, recent (from its load push).",
        [(lbl, w.reported.prefix_cache_hit_rate) for lbl, w in lbls if w.reported is not None],
    )
    out.family(
        "sluice_edge_worker_kv_blocks",
        "gauge",
        "Prefix-cache blocks a worker holds as its KV-cache events told this edge (kv_aware).",
        [(lbl, len(w.cache.held)) for lbl, w in lbls if w.cache.layout is not None],
    )
    out.family(
        "sluice_edge_pool_cache_aware_decisions_total",
        "counter",
        "cache_aware picks by reason: cache (a hit decided), load, balance (the threshold); "
        "kv_aware's prefixed kv_.",
        [
            (labels(pool=name, reason=reason), n)
            for name, p in pools
            for reason, n in sorted(p.decisions.items())
        ],
    )
