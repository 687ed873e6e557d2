"""Tracing's cost on the edge (and worker), side by side in one run (issue 16).

    python -m scripts.bench_tracing --baseline DIR [--rounds 2] [--duration 10]

Three edges in front of sim workers, measured in turn, round after round, with the
harness of `scripts.bench` (its OpenAI SSE driver and per-process CPU from /proc):

- `base`: the edge of DIR, a checkout without tracing (e.g. `git worktree add DIR main`),
- `off`: this tree's edge, tracing off (no endpoint),
- `on`: this tree's edge with `--otlp-endpoint` to `scripts.otlp_sink` (a real OTLP/gRPC
  receiver, its own process), in front of a worker that traces too.

Two workloads: token streams (CPU per event; 64 streams x 50 tokens/s, 1 token per
event) and 1-token streams (CPU per request). Ratios are taken round by round (adjacent
runs share the machine's state), medians reported. Writes scripts/results/NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from scripts import options as shared
from scripts.bench.config import BenchConfig, OutputConfig
from scripts.bench.load import LoadConfig
from scripts.bench.modes import make_factory, measure
from scripts.bench.overhead import process_cpu
from scripts.bench.report import meta
from scripts.bench.stats import summarize
from scripts.bench.workload import WorkloadConfig
from sluice_common.options import add_section, option, section_from

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("base", "off", "on")


@dataclass(frozen=True, slots=True)
class Options:
    baseline: Path = option(
        Path(), "--baseline", "checkout without tracing", type=Path, required=True
    )
    rounds: int = shared.rounds(2)
    duration: float = shared.duration(10.0)
    concurrency: int = shared.concurrency(64)
    stream_tokens: int = option(500, "--stream-tokens", "tokens per stream (per-event runs)")
    token_delay: float = shared.token_delay(0.02)
    name: str = option("issue16-tracing", "--name", "result file name")


class Proc:
    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="sluice-bench-tracing-"))
        self.port_file = self.tmp / "port"
        self.log = self.tmp / "log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [*argv, "--port-file", str(self.port_file)],
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
            )
        deadline = time.monotonic() + 60
        while not (self.port_file.exists() and self.port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{argv} did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)
        self.port = int(self.port_file.read_text())

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.log.read_text(errors="replace")


def worker(code: Path, delay: float, extra: list[str]) -> Proc:
    argv = [sys.executable, "-m", "model_service", "--engine", "sim", "--port", "0",
            f"--sim-token-delay={delay}", "--sim-ttft=0", "--max-num-seqs=256",
            "--max-waiting=256", *extra]  # fmt: skip
    proc = Proc(argv, code, {"PYTHONPATH": str(code)})
    time.sleep(0.5)  # the sim engine is ready at once; the edge waits for SERVING anyway
    return proc


def edge(code: Path, worker_port: int, env: dict[str, str]) -> Proc:
    argv = [sys.executable, "-m", "edge", "--worker", f"127.0.0.1:{worker_port}", "--port", "0"]
    proc = Proc(argv, code, {"PYTHONPATH": str(code), **env})
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{proc.port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"edge not ready:\n{proc.stop()[-3000:]}")


def harness(tokens: int, opts: Options) -> BenchConfig:
    """The harness's overhead-mode settings for one workload (its warm-up: a request per
    stream)."""
    load = LoadConfig(
        concurrency=opts.concurrency, duration_s=opts.duration, warmup=opts.concurrency
    )
    return BenchConfig(
        mode="overhead",
        load=load,
        workload=WorkloadConfig(output_tokens=tokens),
        output=OutputConfig(plot=False, progress=False),
    )


def run_workload(
    name: str, tokens: int, stacks: dict[str, tuple[Proc, Proc]], opts: Options
) -> Any:
    cfg = harness(tokens, opts)
    rows: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(opts.rounds):
        for v in VARIANTS:
            e, w = stacks[v]
            label = f"{name} {v} #{r + 1}"
            factory = make_factory(cfg, "sse", f"http://127.0.0.1:{e.port}", label, False)
            run = summarize(
                measure(cfg, factory, label, {"edge": e.proc.pid, "worker": w.proc.pid})
            )
            row = {
                "edge": process_cpu(run, "edge"),
                "worker": process_cpu(run, "worker"),
                "requests_ok": run["requests"]["ok"],
                "events": run["events_total"],
                "tokens_per_s": run["tokens_per_s"],
            }
            rows[v].append(row)
            print(label, json.dumps(row), flush=True)
    key = "cpu_us_per_event" if tokens > 1 else "cpu_us_per_request"
    out: dict[str, Any] = {"rounds": rows, "key": key}
    for proc in ("edge", "worker"):
        for v in VARIANTS:
            out[f"{proc}.{v}.{key}"] = median(x[proc][key] for x in rows[v])
        for a, b in (("off", "base"), ("on", "off")):
            ratios = [x[proc][key] / y[proc][key] for x, y in zip(rows[a], rows[b], strict=True)]
            out[f"{proc}.{a}/{b}"] = round(median(ratios), 3)
        diffs = [x[proc][key] - y[proc][key] for x, y in zip(rows["on"], rows["off"], strict=True)]
        out[f"{proc}.on-off.{key}"] = round(median(diffs), 2)
    return out


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        f"# {doc['name']}",
        "",
        f"`{doc['command']}`",
        "",
        f"commit {doc['meta'].get('commit')}",
        "",
    ]
    for wl in ("per_event", "per_request"):
        res = doc[wl]
        key = res["key"]
        lines += [f"## {wl} ({key}, medians of {doc['rounds']} rounds)", "",
                  "| process | base | off | on | off/base | on/off | on-off |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for p in ("edge", "worker"):
            lines.append(
                f"| {p} | {res[f'{p}.base.{key}']} | {res[f'{p}.off.{key}']} | "
                f"{res[f'{p}.on.{key}']} | {res[f'{p}.off/base']} | {res[f'{p}.on/off']} | "
                f"{res[f'{p}.on-off.{key}']} |"
            )
        lines.append("")
    lines.append(f"OTLP sink: {doc['sink']}")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_section(p, "tracing", Options)
    opts = section_from(p.parse_args(), "tracing", Options)
    here, base = ROOT, opts.baseline.resolve()
    sink = Proc([sys.executable, "-m", "scripts.otlp_sink"], here, {"PYTHONPATH": str(here)})
    endpoint = f"http://127.0.0.1:{sink.port}"
    procs: list[Proc] = [sink]
    doc: dict[str, Any] = {}
    try:
        for wl, tokens, delay in (("per_event", opts.stream_tokens, opts.token_delay),
                                  ("per_request", 1, 0.0)):  # fmt: skip
            w_off = worker(here, delay, [])
            w_on = worker(here, delay, ["--otlp-endpoint", endpoint])
            e_base = edge(base, w_off.port, {})
            e_off = edge(here, w_off.port, {})
            e_on = edge(here, w_on.port, {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
            started = [e_on, e_off, e_base, w_on, w_off]
            procs += started
            stacks = {"base": (e_base, w_off), "off": (e_off, w_off), "on": (e_on, w_on)}
            try:
                doc[wl] = run_workload(wl, tokens, stacks, opts)
            finally:
                for proc in started:
                    proc.stop()
    finally:
        for proc in reversed(procs):
            out = proc.stop()
            if proc is sink:
                doc["sink"] = out.strip().splitlines()[-1] if out.strip() else ""
    doc.update(
        name=opts.name,
        command=shlex.join(
            [sys.executable.rsplit("/", 1)[-1], "-m", "scripts.bench_tracing", *sys.argv[1:]]
        ),
        rounds=opts.rounds,
        meta=meta(),
    )
    out_dir = ROOT / "scripts" / "results"
    (out_dir / f"{opts.name}.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    (out_dir / f"{opts.name}.md").write_text(markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    main()
