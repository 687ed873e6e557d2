"""Routing mode: placement policies side by side, on sim workers with prefix caches.

For each target, in each round, a fresh stack (so no run inherits another's warm caches):
`workers` sim workers with their prefix cache on and a prefill rate (TTFT follows the
uncached prompt tokens, one prefill at a time per worker), and in front of them either

| target | in front of the workers |
| --- | --- |
| `cache_aware`, `kv_aware`, `least_load`, `random`, `session` | one edge, `--routing-policy` that |
| `session-key` | the same as `session`, each conversation sent as `user` (affinity) |
| `router` | vllm-router `--policy cache_aware` over one edge per worker (the peer) |
| `cache_aware-x2`, `kv_aware-x2` | two edges with that policy behind vllm-router `round_robin` |
| `kv_aware@N` | one edge, `kv_aware` with `--kv-load-slack N` |

`session` is the edge's policy before this mode existed: without a key, the less loaded
of two random workers. The workload is normally `--workload multiturn`.

Per run, besides the usual summary: the client-side prefix-cache hit rate (cached / prompt
tokens from `usage`), each worker's share of the requests (`GetStats.finished_total`
before and after the measured window) with the busiest worker's over the mean, and for
our `cache_aware` the edge's decisions by reason over the window (`/admin/pools`).
`routing` in the result holds medians over rounds per target and the goals of issues 15
and 27 (`cache_aware` and `kv_aware` vs `random` and vs `router`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from scripts.bench.config import SLACK_MARK, BenchConfig
from scripts.bench.fanout import run_in_process
from scripts.bench.load import LoadResult
from scripts.bench.modes import finish, make_factory
from scripts.bench.openai_driver import get_json
from scripts.bench.peers import start_vllm_router
from scripts.bench.procwatch import ProcWatch
from scripts.bench.progress import Progress
from scripts.bench.stacks import Proc, start_edge, start_sim_worker
from scripts.bench.stats import median, summarize

TARGETS = ("cache_aware", "kv_aware", "session", "session-key", "least_load", "random", "router",
           "cache_aware-x2", "kv_aware-x2")  # fmt: skip
REPLICAS = 2  # edges behind vllm-router round_robin in the `-x2` targets
ADMIN_KEY = "routing-bench-admin-key"  # the edges' admin API: their decisions by reason
HIT_OVER_RANDOM_GOAL = 1.5
TTFT_OVER_RANDOM_GOAL = 0.7
MAX_OVER_MEAN_GOAL = 1.5
REPLICA_GOAL = 0.95  # two edge replicas' hit rate over one edge's: no worse, within noise


@dataclass
class _Stack:
    url: str
    workers: list[Proc]
    procs: list[Proc]  # everything started, workers first

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


def _parallel(fns: list[Any]) -> list[Any]:
    with ThreadPoolExecutor(len(fns)) as pool:
        return list(pool.map(lambda f: f(), fns))


def start_stack(cfg: BenchConfig, target: str) -> _Stack:
    r, o = cfg.routing, cfg.overhead
    args = [*worker_args(cfg), *o.worker_args]
    workers: list[Proc] = []
    procs: list[Proc] = []
    try:
        workers = _parallel([lambda: start_sim_worker(args)] * r.workers)
        for i, w in enumerate(workers):
            w.name = f"sim-worker-{i}"
        procs.extend(workers)
        if target.endswith("-x2"):
            policy = target.removesuffix("-x2")
            args = ["--routing-policy", policy, *o.edge_args]
            addresses = [w.address for w in workers]
            edges = _parallel([lambda: start_edge(addresses, args, name="edge")] * REPLICAS)
            for i, e in enumerate(edges):
                e.name = f"edge-{i}"
            procs.extend(edges)
            extra = ["--policy", "round_robin", *o.router_args]
            procs.append(start_vllm_router([e.url for e in edges], extra))
        elif target == "router":
            edges = _parallel(
                [lambda w=w: start_edge(w.address, [*o.edge_args], name="edge") for w in workers]
            )
            for i, e in enumerate(edges):
                e.name = f"edge-{i}"
            procs.extend(edges)
            extra = ["--policy", "cache_aware", *o.router_args]
            procs.append(start_vllm_router([e.url for e in edges], extra))
        else:
            policy, _, slack = target.partition(SLACK_MARK)  # kv_aware@N: that slack
            policy = "session" if policy == "session-key" else policy
            edge_args = ["--routing-policy", policy, *o.edge_args]
            edge_args += ["--kv-load-slack", slack] if slack else []
            env = {"SLUICE_ADMIN_KEY": ADMIN_KEY}
            procs.append(start_edge([w.address for w in workers], edge_args, env=env))
    except BaseException:
        for proc in reversed(procs):
            proc.stop()
        raise
    return _Stack(procs[-1].url, workers, procs)


def worker_args(cfg: BenchConfig) -> list[str]:
    r, o, ld = cfg.routing, cfg.overhead, cfg.load
    slots = max(ld.concurrency, ld.max_concurrency, 64)
    return [
        f"--sim-ttft={o.sim_ttft_s}",
        f"--sim-token-delay={o.sim_token_delay_s}",
        f"--sim-prefill-rate={r.prefill_rate}",
        f"--sim-kv-tokens={r.kv_tokens}",
        f"--max-num-seqs={slots}",
        f"--max-waiting={slots * 4}",
        "--max-model-len=131072",
        "--max-prompt-bytes=8388608",
        "--sim-prefix-cache",
    ]


async def _finished(addresses: list[str]) -> list[int]:
    async def one(address: str) -> int:
        async with grpc.aio.insecure_channel(address) as ch:
            stats = await pb_grpc.GenerationStub(ch).GetStats(pb.GetStatsRequest(), timeout=5)
            return int(stats.finished_total)

    return list(await asyncio.gather(*(one(a) for a in addresses)))


async def _decisions(stack: _Stack) -> dict[str, int]:
    """The edge's cache_aware decisions by reason so far ({} for the router's stack)."""
    edge = stack.procs[-1]
    if edge.name != "edge":
        return {}
    doc = await get_json("127.0.0.1", edge.port, "/admin/pools", api_key=ADMIN_KEY)
    return dict(doc["pools"][0].get("decisions") or {})


def measure(cfg: BenchConfig, stack: _Stack, target: str, label: str) -> tuple[LoadResult, dict]:
    """One run against one stack: the load, and each worker's requests in the window."""
    workload = dataclasses.replace(cfg.workload, session_user=target == "session-key")
    factory = make_factory(cfg, "sse", stack.url, label, False, workload)
    addresses = [p.address for p in stack.workers]
    watcher = ProcWatch({p.name: p.pid for p in stack.procs} | dict(cfg.watch))
    before: list[int] = []
    decided: dict[str, int] = {}

    async def measuring() -> None:
        before.extend(await _finished(addresses))
        decided.update(await _decisions(stack))
        watcher.start()

    progress = Progress(label, cfg.output.progress, cfg.load.requests)
    try:
        result = asyncio.run(run_in_process(factory, workload, cfg.load, progress, ready=measuring))
    finally:
        processes = watcher.stop()
    after = asyncio.run(_finished(addresses))
    decisions = asyncio.run(_decisions(stack))
    result.label = label
    result.processes = processes
    served = [a - b for a, b in zip(after, before, strict=True)]
    mean = sum(served) / len(served) if served else 0
    share = {
        "requests_per_worker": served,
        "max_over_mean": round(max(served) / mean, 3) if mean else None,
        "decisions": {k: n - decided.get(k, 0) for k, n in sorted(decisions.items())},
    }
    return result, share


def analysis(runs: list[dict[str, Any]], shares: dict[str, dict], targets: tuple[str, ...]) -> dict:
    """Medians over rounds per target, ratios round by round, the goals."""
    out: dict[str, Any] = {}
    by: dict[str, list[dict[str, Any]]] = {t: [] for t in targets}
    for run in runs:
        by[run["label"].rsplit(" #", 1)[0]].append(run)
    metrics = {
        "hit_rate": lambda r: r["prefix_cache"]["hit_rate"],
        "ttft_p50_ms": lambda r: r["ttft_ms"].get("p50"),
        "ttft_p99_ms": lambda r: r["ttft_ms"].get("p99"),
        "e2e_p50_ms": lambda r: r["e2e_ms"].get("p50"),
        "requests_per_s": lambda r: r["requests_per_s"],
        "max_over_mean_load": lambda r: shares[r["label"]]["max_over_mean"],
    }
    for t, mine in by.items():
        for name, get in metrics.items():
            out[f"{t}.{name}"] = median([get(r) for r in mine])
        out[f"{t}.errors"] = sum(r["requests"]["errors"] for r in mine)

    def ratio(a: str, b: str, name: str) -> float | None:
        get = metrics[name]
        pairs = zip(by.get(a, []), by.get(b, []), strict=False)
        return median([get(x) / get(y) for x, y in pairs if get(x) is not None and get(y)])

    slacks = [t for t in targets if SLACK_MARK in t]
    for ca in ("cache_aware", "kv_aware", "cache_aware-x2", "kv_aware-x2", *slacks):
        if ca not in by:
            continue
        one = ca.removesuffix("-x2")
        if ca != one and one in by:  # replicas: no worse than one edge (within noise)
            out[f"{ca}_over_{one}.hit_rate"] = x = ratio(ca, one, "hit_rate")
            out[f"goal {ca} hit_rate >= {REPLICA_GOAL}x one edge's"] = _goal(x, REPLICA_GOAL, ">=")
        if "random" in by:
            out[f"{ca}_over_random.hit_rate"] = h = ratio(ca, "random", "hit_rate")
            out[f"{ca}_over_random.ttft_p50"] = p = ratio(ca, "random", "ttft_p50_ms")
            out[f"goal {ca} hit_rate >= {HIT_OVER_RANDOM_GOAL}x random"] = _goal(
                h, HIT_OVER_RANDOM_GOAL, ">="
            )
            out[f"goal {ca} ttft_p50 <= {TTFT_OVER_RANDOM_GOAL}x random"] = _goal(
                p, TTFT_OVER_RANDOM_GOAL, "<="
            )
        if "router" in by:
            for name, op in (("hit_rate", ">="), ("ttft_p50_ms", "<="), ("ttft_p99_ms", "<=")):
                value = ratio(ca, "router", name)
                out[f"{ca}_over_router.{name}"] = value
                out[f"goal {ca} {name} {op} vllm-router's"] = _goal(value, 1.0, op)
        out[f"goal {ca} max worker load <= {MAX_OVER_MEAN_GOAL}x mean"] = _goal(
            out[f"{ca}.max_over_mean_load"], MAX_OVER_MEAN_GOAL, "<="
        )
    return out


def _goal(value: float | None, limit: float, op: str) -> str:
    if value is None:
        return "-"
    return "met" if (value >= limit if op == ">=" else value <= limit) else "not met"


def routing_mode(cfg: BenchConfig) -> dict[str, Any]:
    results: list[LoadResult] = []
    shares: dict[str, dict] = {}
    targets = cfg.routing.targets
    for r in range(cfg.rounds):
        for target in targets:
            label = f"{target} #{r + 1}"
            stack = start_stack(cfg, target)
            try:
                result, share = measure(cfg, stack, target, label)
            finally:
                stack.stop()
            results.append(result)
            shares[label] = share
    runs = [summarize(x) for x in results]
    doc_extra = {"routing": analysis(runs, shares, targets), "worker_shares": shares}
    return finish(cfg, results, doc_extra)
