"""The harness's modes: what to start, what to run in which order, what to compare.

- `run`: one target that is already running (our edge, a worker, any OpenAI server).
- `overhead`: the sim engine at (by default) zero delay, so only transport is measured:
  gRPC straight to the worker, SSE through the edge and SSE through a peer (vllm-router or
  SMG) in front of the edge (`--targets`), alternating for `rounds`, with worker time
  stamps; reports each hop's added latency, bytes on the wire per token, and each server
  process's CPU per event and per request (`overhead.py`).
- `compare`: two targets alternating A, B, A, B... (`rounds`), ratios of their medians;
  `sluice` / `vllm` / `smg-grpc` start our stack, vLLM's own server, or SMG's gRPC router
  in front of vLLM's gRPC server, from one model directory.
- `routing`: placement policies side by side on sim workers with prefix caches
  (`routing.py`); `decision`: the edge's own worker choice timed in process
  (`decision.py`).
"""

from __future__ import annotations

import asyncio
import datetime
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from scripts.bench import plot, report
from scripts.bench.comparison import comparison
from scripts.bench.config import BenchConfig
from scripts.bench.fanout import DriverFactory, run_fanout, run_in_process
from scripts.bench.grpc_driver import GrpcDriver
from scripts.bench.load import LoadResult
from scripts.bench.openai_driver import OpenAIDriver
from scripts.bench.overhead import overhead_analysis
from scripts.bench.peers import start_smg, start_smg_grpc, start_vllm_router
from scripts.bench.procwatch import ProcWatch
from scripts.bench.progress import Progress
from scripts.bench.stacks import (
    Proc,
    start_edge,
    start_sim_worker,
    start_vllm_grpc_server,
    start_vllm_server,
    start_vllm_worker,
)
from scripts.bench.stats import summarize
from scripts.bench.workload import WorkloadConfig


def make_factory(
    cfg: BenchConfig,
    kind: str,
    where: str,
    label: str,
    stamp: bool,
    workload: WorkloadConfig | None = None,
) -> DriverFactory:
    t, w = cfg.target, workload or cfg.workload
    if kind == "grpc":
        return partial(GrpcDriver, where, w, model=t.model, stamp=stamp,
                       channels=t.grpc_channels, timeout=t.timeout_s, label=label)  # fmt: skip
    return partial(OpenAIDriver, where, w, model=t.model, stamp=stamp, api_key=t.api_key,
                   timeout=t.timeout_s, label=label, gzip=t.accept_gzip)  # fmt: skip


def measure(
    cfg: BenchConfig, factory: DriverFactory, label: str, watch: dict[str, int] | None = None
) -> LoadResult:
    """One run of the configured load against one target (fanned out if --procs > 1),
    with the CPU and memory of the `watch` processes during the run."""
    watcher = ProcWatch(watch | dict(cfg.watch) if watch else dict(cfg.watch))

    async def measuring() -> None:  # after warm-up: server costs of measured requests only
        watcher.start()

    try:
        if cfg.procs > 1:
            result = run_fanout(
                factory, cfg.workload, cfg.load, cfg.procs, cfg.output.progress, watcher.start
            )
        else:
            progress = Progress(label, cfg.output.progress, cfg.load.requests)
            result = asyncio.run(
                run_in_process(factory, cfg.workload, cfg.load, progress, ready=measuring)
            )
    finally:
        processes = watcher.stop()
    result.label = label
    result.processes = processes
    return result


def finish(cfg: BenchConfig, results: list[LoadResult], extra: dict[str, Any]) -> dict[str, Any]:
    """Summaries -> JSON, markdown (also printed) and PNG; returns the document."""
    doc: dict[str, Any] = {
        "meta": report.meta(),
        "mode": cfg.mode,
        "config": cfg,
        "runs": [summarize(r) for r in results],
        **extra,
    }
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = cfg.output.name or f"{cfg.mode}-{stamp}"
    json_path, md_path = report.write(doc, cfg.output.out_dir, name)
    print(report.markdown(doc))
    written = [json_path, md_path]
    if cfg.output.plot:
        png = plot.write_png(results, cfg.output.out_dir / f"{name}.png", doc["meta"]["command"])
        if png is None:
            print("plot skipped: matplotlib is not installed", file=sys.stderr)
        else:
            written.append(png)
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return doc


def run_mode(cfg: BenchConfig) -> dict[str, Any]:
    t = cfg.target
    where = t.url if t.kind == "sse" else t.address
    result = measure(cfg, make_factory(cfg, t.kind, where, t.kind, bool(t.stamp)), t.kind)
    return finish(cfg, [result], {})


def _sim_worker_args(cfg: BenchConfig) -> list[str]:
    ld, w, o = cfg.load, cfg.workload, cfg.overhead
    slots = max(ld.concurrency, ld.max_concurrency, 1024)
    per_request = (
        int(w.prompt_tokens * (1 + w.prompt_spread) + w.output_tokens * (1 + w.output_spread)) + 64
    )
    return [
        f"--sim-ttft={o.sim_ttft_s}",
        f"--sim-token-delay={o.sim_token_delay_s}",
        f"--max-num-seqs={slots}",
        f"--max-waiting={slots}",
        f"--sim-kv-tokens={max(262_144, slots * per_request * 2)}",
        f"--max-model-len={max(2048, per_request * 2)}",
        *o.worker_args,
    ]


def overhead_mode(cfg: BenchConfig) -> dict[str, Any]:
    o = cfg.overhead
    stamp = cfg.target.stamp is not False
    started: list[Proc] = []
    try:
        worker = o.worker
        if not worker:
            started.append(start_sim_worker(_sim_worker_args(cfg)))
            worker = started[-1].address
        edge = o.edge
        if {"sse", "router", "smg"} & set(o.targets) and not edge:
            # The edge forwards worker stamps only when told to (`--allow-stamps`).
            stamps = ["--allow-stamps"] if stamp else []
            started.append(start_edge(worker, [*stamps, *o.edge_args]))
            edge = started[-1].url
        peers = {
            "router": lambda: start_vllm_router(edge, list(o.router_args)),
            "smg": lambda: start_smg(edge, list(o.smg_args)),
        }
        where = {"grpc": worker, "sse": edge}
        for target in o.targets:
            if target in peers:
                started.append(peers[target]())
                where[target] = started[-1].url
        pids = {p.name: p.pid for p in started}
        results = []
        for r in range(cfg.rounds):
            for target in o.targets:
                label = target if cfg.rounds == 1 else f"{target} #{r + 1}"
                kind = "grpc" if target == "grpc" else "sse"
                factory = make_factory(cfg, kind, where[target], label, stamp)
                results.append(measure(cfg, factory, label, pids))
    finally:
        for proc in reversed(started):  # the peers first, then the edge, then the worker
            proc.stop()
    runs = [summarize(r) for r in results]
    w = cfg.workload
    analysis = overhead_analysis(
        runs,
        o.targets,
        cfg.load.concurrency,
        o.sim_token_delay_s,
        one_token=w.output_tokens == 1 and not w.output_spread,
    )
    return finish(cfg, results, {"overhead": analysis})


# Compare mode's processes, in the order they stop (the one in front first).
STACK_KEYS = ("edge", "vllm-worker", "vllm-server", "smg-grpc", "vllm-grpc-server")


class _Stacks:
    """Starts the named stacks on first use (two at once from two threads: engine loading
    is slow) and stops them in order."""

    def __init__(self, cfg: BenchConfig) -> None:
        self.cfg = cfg
        self.procs: dict[str, Proc] = {}
        self._locks = {k: threading.Lock() for k in STACK_KEYS}

    def _get(self, key: str) -> Proc:
        with self._locks[key]:
            if key not in self.procs:
                self.procs[key] = self._start(key)
            return self.procs[key]

    def _start(self, key: str) -> Proc:
        c = self.cfg.compare
        if key == "vllm-worker":
            return start_vllm_worker(c.model_dir, c.engine)
        if key == "edge":
            return start_edge(self._get("vllm-worker").address, [])
        if key == "vllm-grpc-server":
            return start_vllm_grpc_server(c.model_dir, c.engine)
        if key == "smg-grpc":
            address = self._get("vllm-grpc-server").address
            return start_smg_grpc(address, c.model_dir, list(self.cfg.overhead.smg_args))
        return start_vllm_server(c.model_dir, c.engine)

    def resolve_all(self, specs: tuple[str, ...]) -> list[tuple[str, str, str]]:
        with ThreadPoolExecutor(len(specs)) as pool:
            return list(pool.map(self.resolve, specs))

    def resolve(self, spec: str) -> tuple[str, str, str]:
        """A compare target -> (driver kind, URL or address, label)."""
        if spec == "sluice":
            return "sse", self._get("edge").url, spec
        if spec == "sluice-grpc":
            return "grpc", self._get("vllm-worker").address, spec
        if spec == "vllm":
            return "sse", self._get("vllm-server").url, spec
        if spec == "smg-grpc":
            return "sse", self._get("smg-grpc").url, spec
        if spec.startswith(("http://", "sse:")):
            return "sse", spec.removeprefix("sse:"), spec
        if spec.startswith("grpc:"):
            return "grpc", spec.removeprefix("grpc:"), spec
        raise SystemExit(f"unknown compare target {spec!r}")

    def stop(self, keys: tuple[str, ...] = STACK_KEYS) -> None:
        for key in keys:
            proc = self.procs.pop(key, None)
            if proc is not None:
                proc.stop(60)


def compare_mode(cfg: BenchConfig) -> dict[str, Any]:
    a, b = cfg.compare.targets
    stacks = _Stacks(cfg)
    results: list[LoadResult] = []
    try:
        if cfg.compare.one_at_a_time:
            for spec in (a, b):
                kind, where, label = stacks.resolve(spec)
                for r in range(cfg.rounds):
                    results.append(_compare_run(cfg, stacks, kind, where, f"{label} #{r + 1}"))
                stacks.stop()
        else:
            resolved = stacks.resolve_all((a, b))
            for r in range(cfg.rounds):
                for kind, where, label in resolved:
                    results.append(_compare_run(cfg, stacks, kind, where, f"{label} #{r + 1}"))
    finally:
        stacks.stop()
    runs = [summarize(r) for r in results]
    return finish(cfg, results, {"comparison": comparison(runs, a, b)})


def _compare_run(
    cfg: BenchConfig, stacks: _Stacks, kind: str, where: str, label: str
) -> LoadResult:
    pids = {k: p.pid for k, p in stacks.procs.items()}
    return measure(cfg, make_factory(cfg, kind, where, label, False), label, pids)
