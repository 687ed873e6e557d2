"""`PoolRegistry`: the pools of workers, the pick (`edge.routing.scores` for the math, each
pool's `Placement` for the worker in it), runtime changes and per-pool metrics. Changes
apply to new requests at once (one event loop, no locks); a running call keeps its
worker, and a removed worker's channel closes after its last call here."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Collection, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from edge.config import RoutingConfig
from edge.errors import ApiError, no_worker
from edge.obs.outcomes import PoolMetrics
from edge.routing.metrics import render_registry
from edge.routing.placement import Placement
from edge.routing.pools import PoolSpec, RollbackSpec, build_pools
from edge.routing.prefix import Prompt
from edge.routing.scores import weighted_hrw, weighted_random
from edge.upstream.channel import ChannelFactory
from edge.upstream.worker import UNKNOWN, Worker
from generated import sluice_pb2 as pb

log = logging.getLogger("sluice.edge")


@dataclass(eq=False)
class Pool:
    """Workers of one model version, and their share of new traffic."""

    name: str
    version: str
    weight: float
    rollback: RollbackSpec | None = None
    workers: dict[str, Worker] = field(default_factory=dict)  # by address
    rolled_back: dict[str, object] | None = None  # the last automatic rollback
    # Why the pool is leaving ("drained", "rolled_back"; "" = it is not): it takes no new
    # sessions, and sessions pinned to it move on at their next request.
    draining: str = ""
    placement: Placement = field(default_factory=Placement)  # worker choice, by its policy


Group = tuple[Pool, list[Worker]]
# Stricter first: routable; then SERVING ignoring passive marks (nginx tries marked-down
# servers when nothing else is left); then workers whose health is not known yet.
_LEVELS: tuple[Callable[[Worker, float], bool], ...] = (
    lambda w, now: w.routable(now),
    lambda w, now: w.serving and not w.removed,
    lambda w, now: w.status == UNKNOWN and not w.removed,
)


class PoolRegistry:
    """See the module docstring."""

    def __init__(
        self,
        specs: Sequence[PoolSpec],
        opts: RoutingConfig,
        channels: ChannelFactory,
        rng: random.Random | None = None,
    ) -> None:
        self.options = opts
        self._channels = channels
        self._rng = rng or random.Random()
        self.pools: dict[str, Pool] = {}
        self.metrics: dict[str, PoolMetrics] = {}
        self.collect = False  # pools keep their outcomes for the fleet's windows
        self._retiring: set[Worker] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = False
        for spec in specs:
            self.add_pool(spec)

    # -- life -------------------------------------------------------------------------

    def start(self) -> None:
        self._started = True
        for pool in self.pools.values():
            for w in pool.workers.values():
                self._start(pool, w)

    @staticmethod
    def _start(pool: Pool, worker: Worker) -> None:
        worker.start()
        if pool.placement.policy == "kv_aware":  # its events from the start, not the first pick
            worker.follow_cache()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        everyone = [*self.workers, *self._retiring]
        await asyncio.gather(*(w.close() for w in everyone), return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- picking ----------------------------------------------------------------------

    @property
    def workers(self) -> list[Worker]:
        """Every worker in a pool (removed ones that still finish calls are not listed)."""
        return [w for p in self.pools.values() for w in p.workers.values()]

    def routes_on_tokens(self) -> bool:
        """Some pool places by the prompt's token ids (`kv_aware`): worth tokenizing first."""
        return any(p.placement.policy == "kv_aware" for p in self.pools.values())

    def ready(self) -> bool:
        """At least one worker reports SERVING."""
        return any(w.serving for w in self.workers)

    def pick(
        self,
        model: str = "",
        key: str = "",
        exclude: Collection[str] = (),
        prefer_pool: str = "",
        pool: str = "",
        prompt: Prompt | None = None,
        task: pb.ModelTask = pb.TASK_GENERATE,
    ) -> Worker:
        """A worker for a new generation (or a retry: `exclude` holds addresses tried).

        With a session key: the key's pool by weighted rendezvous, then its worker by
        rendezvous. Without: a pool at random by weight, then a worker by the pool's
        policy (`prompt` feeds `cache_aware`). `pool` (a pinned session) picks in that pool
        only, whatever its weight; `prefer_pool` (a failover) stays in that pool while it
        has candidates. Draining pools take nothing new. Raises ApiError: 404 when SERVING
        workers exist but none has `model`, 400 when those that have it
        serve another `task` (an embedding model for a generation, or the reverse), else 503.
        """
        now = time.monotonic()
        named = pool or prefer_pool
        for level in _LEVELS:
            groups = self._groups(model, exclude, level, now, named, bool(pool), task)
            if groups:
                return self._choose(groups, key, prefer_pool, prompt)
        serving = [w for w in self.workers if w.serving and not w.removed]
        other: pb.ModelTask = pb.TASK_EMBED if task == pb.TASK_GENERATE else pb.TASK_GENERATE
        if serving and not any(_serves(w, model, task) for w in serving):
            if any(w.models and _serves(w, model, other) for w in serving):
                raise wrong_task(model, task)
        if model and serving and not any(_has_model(w, model) for w in serving):
            names = sorted({m.id for w in serving for m in w.models})
            raise ApiError(
                404,
                f"model {model!r} is not served here (serving {', '.join(map(repr, names))})",
                param="model",
                code="model_not_found",
            )
        raise no_worker()

    def _groups(
        self,
        model: str,
        exclude: Collection[str],
        ok: Callable[[Worker, float], bool],
        now: float,
        named: str = "",
        only: bool = False,
        task: pb.ModelTask = pb.TASK_GENERATE,
    ) -> list[Group]:
        groups: list[Group] = []
        for pool in self.pools.values():
            if pool.draining or (only and pool.name != named):
                continue
            if pool.weight <= 0 and pool.name != named:
                continue
            ws = [
                w
                for w in pool.workers.values()
                if w.address not in exclude and ok(w, now) and _serves(w, model, task)
            ]
            if model and len(ws) > 1:  # adapter affinity: where it is at work already
                ws = [w for w in ws if w.warm(model)] or ws
            if ws:
                groups.append((pool, ws))
        return groups

    def _choose(
        self, groups: list[Group], key: str, prefer_pool: str, prompt: Prompt | None = None
    ) -> Worker:
        preferred = [g for g in groups if g[0].name == prefer_pool]
        if preferred:
            group = preferred[0]
        elif key:
            group = weighted_hrw(key, groups, lambda g: g[0].name, lambda g: g[0].weight)
        else:
            group = weighted_random(groups, lambda g: g[0].weight, self._rng)
        return group[0].placement.choose(group[1], key, prompt)

    # -- calls report back ----------------------------------------------------------------

    def released(self, worker: Worker) -> None:
        """A call on `worker` ended: close a removed worker's channel after its last call."""
        if worker.removed and worker.in_flight <= 0 and worker in self._retiring:
            self._retiring.discard(worker)
            worker.closed = True  # now: a call picked before the removal must not start
            self._spawn(worker.close(), f"close {worker.address}")

    def pool_metrics(self, pool: str) -> PoolMetrics:
        # Called for every upstream chunk: build a PoolMetrics only when missing
        # (setdefault would build and drop one each time, histograms included).
        metrics = self.metrics.get(pool)
        if metrics is None:
            metrics = self.metrics[pool] = PoolMetrics(self.collect)
        return metrics

    # -- runtime changes (admin API, canary) ------------------------------------------------

    def candidates(self, pool: str, model: str = "") -> list[Worker]:
        """The workers `pick(pool=...)` chooses among now (the strictest level with any)."""
        now = time.monotonic()
        found = (self._groups(model, (), ok, now, pool, True) for ok in _LEVELS)
        return next((g[0][1] for g in found if g), [])

    def refuses_pin(self, name: str) -> str:
        """Why a session pinned to pool `name` must move ("" if it may stay)."""
        pool = self.pools.get(name)
        return "removed" if pool is None else pool.draining

    def pool(self, name: str) -> Pool:
        pool = self.pools.get(name)
        if pool is None:
            raise ApiError(404, f"no pool named {name!r}", type="not_found_error", code="no_pool")
        return pool

    def find_worker(self, ref: str) -> Worker | None:
        """A worker by address or key, in a pool or still finishing calls after removal."""
        for w in [*self.workers, *self._retiring]:
            if ref in (w.address, w.key):
                return w
        return None

    def find(self, key: str) -> Worker:
        """The worker with this key (`resume.worker_key`), for resuming its streams."""
        worker = self.find_worker(key)
        if worker is None:
            raise ApiError(
                410,
                "the worker that held this stream is no longer known to this edge",
                code="stream_lost",
            )
        return worker

    def add_pool(self, spec: PoolSpec) -> Pool:
        if spec.name in self.pools:
            raise ApiError(409, f"pool {spec.name!r} exists already", code="conflict")
        for a in spec.workers:
            self._check_free(a)
        pool = Pool(spec.name, spec.version, spec.weight, spec.rollback)
        pool.placement = Placement(spec.policy, self.options, self._rng)
        self.pools[spec.name] = pool
        self.pool_metrics(spec.name)
        for a in spec.workers:
            self._add(pool, a)
        log.info(
            "pool %s (%s): weight %g, %d worker(s)",
            pool.name,
            pool.version or "-",
            pool.weight,
            len(pool.workers),
        )
        return pool

    def remove_pool(self, name: str) -> None:
        pool = self.pool(name)
        for address in list(pool.workers):
            self.remove_worker(name, address)
        del self.pools[name]
        log.info("pool %s removed", name)

    def set_weight(self, name: str, weight: float, reason: str = "admin", new: bool = True) -> Pool:
        """An operator's weight > 0 takes a draining pool back; `new`: a fresh window."""
        pool = self.pool(name)
        if reason == "admin" and weight > 0 and pool.draining:
            pool.draining = ""
        if weight != pool.weight:
            log.info("pool %s: weight %g -> %g (%s)", name, pool.weight, weight, reason)
            pool.weight = weight
            if new:
                self.pool_metrics(name).clear_window()
        return pool

    def drain(self, name: str, reason: str = "drained") -> Pool:
        """Weight 0, no new sessions, and its pinned sessions move on (streams finish)."""
        pool = self.set_weight(name, 0.0, reason, new=False)
        pool.draining = reason
        return pool

    def add_worker(self, pool_name: str, address: str) -> Worker:
        pool = self.pool(pool_name)
        self._check_free(address)
        worker = self._add(pool, address)
        log.info("pool %s: worker %s added", pool_name, address)
        return worker

    def remove_worker(self, pool_name: str, ref: str) -> Worker:
        pool = self.pool(pool_name)
        worker = pool.workers.get(ref) or next(
            (w for w in pool.workers.values() if w.key == ref), None
        )
        if worker is None:
            raise ApiError(
                404,
                f"no worker {ref!r} in pool {pool_name!r}",
                type="not_found_error",
                code="no_worker",
            )
        del pool.workers[worker.address]
        pool.placement.forget(worker)
        worker.removed = True
        self._retiring.add(worker)
        log.info(
            "pool %s: worker %s removed (%d call(s) finishing)",
            pool_name,
            worker.address,
            worker.in_flight,
        )
        self.released(worker)
        return worker

    def _check_free(self, address: str) -> None:
        if ":" not in address or not address.rsplit(":", 1)[1].isdigit():
            raise ApiError(400, f"worker address {address!r} is not host:port", param="address")
        for p in self.pools.values():
            if address in p.workers:
                raise ApiError(409, f"worker {address} is in pool {p.name!r}", code="conflict")

    def _add(self, pool: Pool, address: str) -> Worker:
        worker = Worker(address, pool.name, self._channels, self.options)
        pool.workers[address] = worker
        if self._started:
            self._start(pool, worker)
        return worker

    # -- views ------------------------------------------------------------------------------

    def describe(self) -> dict[str, object]:
        """Pools, weights, workers and recent outcomes (GET /admin/pools)."""
        now = time.monotonic()
        out = []
        for pool in self.pools.values():
            window_s = pool.rollback.window_s if pool.rollback else 60.0
            stats = self.pool_metrics(pool.name).window(window_s, now)
            out.append(
                {
                    "name": pool.name,
                    "version": pool.version,
                    "weight": pool.weight,
                    "policy": pool.placement.policy,
                    "decisions": dict(pool.placement.decisions),
                    "rollback": pool.rollback.to_dict() if pool.rollback else None,
                    "rolled_back": pool.rolled_back,
                    "draining": pool.draining or None,
                    "window": {"seconds": window_s, **stats.to_dict()},
                    "workers": [w.describe(now) for w in pool.workers.values()],
                }
            )
        return {"pools": out}

    def render_metrics(self) -> str:
        """Per-pool and per-worker lines for the edge's /metrics."""
        return render_registry(self)


def _has_model(worker: Worker, model: str) -> bool:
    return not model or not worker.models or any(m.id == model for m in worker.models)


def _serves(worker: Worker, model: str, task: pb.ModelTask) -> bool:
    """It lists `model` (any, for "") for `task`; one whose models are not listed yet is
    taken for a generating worker, as before embeddings."""
    if not worker.models:
        return task == pb.TASK_GENERATE
    return any((not model or m.id == model) and m.task == task for m in worker.models)


def wrong_task(model: str, task: pb.ModelTask) -> ApiError:
    """A request for a model that serves the other task: a 400 saying which route fits."""
    name = repr(model) if model else "the model here"
    if task == pb.TASK_EMBED:
        why = f"{name} generates and serves no embeddings (a pooling worker does)"
    else:
        why = f"{name} is an embedding model: it serves /v1/embeddings only"
    return ApiError(400, why, param="model", code="model_not_supported")


def registry_from_config(config: RoutingConfig, channels: ChannelFactory) -> PoolRegistry:
    """The pools of `--pools` and `--worker`, with the routing options."""
    specs = build_pools(config.pools_file, config.workers)
    return PoolRegistry(specs, config, channels)
