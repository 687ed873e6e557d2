"""Limits benchmark: what a shared store costs per request, embedded vs Redis.

    python -m scripts.limits_bench                 # ~45 s; results in scripts/results
    python -m scripts.limits_bench --seconds 3 --rounds 1 --out /tmp

Starts a real redis-server on a free port, one sim worker and two one-process edges with
every per-key limit on (requests/s, streams, tokens per minute; set high enough never to
refuse): one with the embedded store, one with `--store-url`. In each of `--rounds`
rounds, each edge in turn gets `--concurrency` clients sending non-streamed chat
completions (2 tokens) for `--seconds`; it reports requests/s, the client's p50/p99
latency, and the CPU time per request of the edge process and of redis-server (from
/proc, over the drive). The Redis edge's difference is the cost of the store's round
trips (three Lua calls per generation: the rate's token with the stream lease, the
token reserve, the lease's release with the token settlement; five before 0b44052)
plus its background work (control watch, canary-window flushes). Medians over the
rounds are the summary.

Results: scripts/results/limits.{json,md} (or --out DIR), with the command and commit.
Traffic goes to 127.0.0.1 only, bounded by --seconds x --rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from scripts import options as shared
from sluice_common.options import add_section, option, section_from
from tests.integration.edge_fixtures import EDGE_ENV, wait_ready
from tests.procs import start_edge, start_worker
from tests.redis_proc import redis_server

KEY = "bench:sk-bench-0123456789abcdef"
LIMITS = ["--rate-limit", "100000", "--max-streams-per-key", "10000", "--tpm-limit", "100000000"]


@dataclass(frozen=True, slots=True)
class Options:
    seconds: float = option(6.0, "--seconds", "seconds per drive (one edge, one round)")
    rounds: int = shared.rounds(3, "rounds, each edge in turn (medians reported)")
    concurrency: int = shared.concurrency(8, "clients, each sending back to back")
    out: Path = shared.results_dir()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(base: str, concurrency: int, seconds: float) -> dict[str, float]:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = {"authorization": f"Bearer {KEY.split(':', 1)[1]}"}
    lat: list[float] = []
    bad = 0
    async with httpx.AsyncClient(timeout=10) as client:
        for _ in range(concurrency):  # warm the connections
            await client.post(f"{base}/v1/chat/completions", json=body, headers=headers)
        t0 = time.monotonic()

        async def loop() -> None:
            nonlocal bad
            while time.monotonic() - t0 < seconds:
                t = time.perf_counter()
                r = await client.post(f"{base}/v1/chat/completions", json=body, headers=headers)
                lat.append(time.perf_counter() - t)
                bad += r.status_code != 200

        await asyncio.gather(*(loop() for _ in range(concurrency)))
        elapsed = time.monotonic() - t0
    lat.sort()
    return {
        "requests": len(lat),
        "non_200": bad,
        "rps": round(len(lat) / elapsed, 1),
        "p50_ms": round(lat[len(lat) // 2] * 1000, 3),
        "p99_ms": round(lat[int(len(lat) * 0.99)] * 1000, 3),
    }


def commands(url: str) -> int:
    """Commands redis-server has processed so far (its INFO stats)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        return int(client.info("stats")["total_commands_processed"])
    finally:
        client.close()


def measure(base: str, pids: dict[str, int], opts: Options, redis_url: str) -> dict[str, float]:
    before = {k: cpu_s(p) for k, p in pids.items()}
    sent = commands(redis_url)
    result = asyncio.run(drive(base, opts.concurrency, opts.seconds))
    for k, p in pids.items():
        used = cpu_s(p) - before[k]
        result[f"{k}_cpu_us_per_request"] = round(used / max(result["requests"], 1) * 1e6, 1)
    # Less the INFO call of `commands` itself; an exact count where CPU ticks are coarse
    # (commands run inside Lua scripts count one each).
    # It includes the Redis edge's background commands (fleet control, canary windows,
    # the rollout lease), sent in both edges' windows.
    done = commands(redis_url) - sent - 1
    result["redis_commands_per_request"] = round(done / max(result["requests"], 1), 2)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_section(p, "limits", Options)
    opts = section_from(p.parse_args(argv), "limits", Options)
    env = {**EDGE_ENV, "SLUICE_API_KEYS": KEY}
    rounds: dict[str, list[dict[str, float]]] = {"embedded": [], "redis": []}
    with redis_server() as redis:
        assert redis.proc is not None
        worker = start_worker("--engine", "sim", "--sim-token-delay", "0")
        edges = {}
        try:
            for name, extra in (("embedded", []), ("redis", ["--store-url", redis.url])):
                edges[name] = start_edge("--worker", worker.address, *LIMITS, *extra, env=env)
                wait_ready(f"http://{edges[name].address}")
            for _ in range(opts.rounds):
                for name, edge in edges.items():
                    pids = {"edge": edge.pid, "redis": redis.proc.pid}
                    base = f"http://{edge.address}"
                    rounds[name].append(measure(base, pids, opts, redis.url))
        finally:
            for edge in edges.values():
                edge.kill()
            worker.kill()
    results = {
        name: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        for name, runs in rounds.items()
    }
    emb, red = results["embedded"], results["redis"]
    cost = {
        "p50_ms": round(red["p50_ms"] - emb["p50_ms"], 3),
        "edge_cpu_us_per_request": round(
            red["edge_cpu_us_per_request"] - emb["edge_cpu_us_per_request"], 1
        ),
        "redis_cpu_us_per_request": red["redis_cpu_us_per_request"],
        "rps_ratio": round(red["rps"] / emb["rps"], 3),
    }
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    doc = {
        "command": " ".join(["python -m scripts.limits_bench", *(argv or sys.argv[1:])]),
        "commit": commit.stdout.strip(),
        "concurrency": opts.concurrency,
        "seconds": opts.seconds,
        "rounds": rounds,
        "results": results,
        "redis_cost": cost,
    }
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "limits.json").write_text(json.dumps(doc, indent=2) + "\n")
    rows = [
        f"| {n} | {r['rps']} | {r['p50_ms']} | {r['p99_ms']} | "
        f"{r['edge_cpu_us_per_request']} | {r['redis_cpu_us_per_request']} | {r['non_200']} |"
        for n, r in results.items()
    ]
    md = [
        "# Limits: embedded store vs Redis (one edge process, every limit on)",
        "",
        f"`{doc['command']}` at {doc['commit']}, {opts.concurrency} clients, "
        f"{opts.seconds} s per drive, {opts.rounds} rounds alternating the two edges "
        "(medians), non-streamed chat completions of 2 tokens (sim worker).",
        "",
        "| store | requests/s | p50 ms | p99 ms | edge CPU µs/request | redis CPU µs/request "
        "| non-200 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        f"Redis's cost per request: {cost['p50_ms']:+} ms at p50, "
        f"{cost['edge_cpu_us_per_request']:+} µs of edge CPU, "
        f"{cost['redis_cpu_us_per_request']} µs of redis-server CPU; "
        f"requests/s x{cost['rps_ratio']}.",
        "",
    ]
    (out / "limits.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
