"""Limits benchmark: what a shared store costs per request, embedded vs Redis.

    python -m scripts.limits_bench                 # ~20 s; results in scripts/results
    python -m scripts.limits_bench --seconds 3 --out /tmp

Starts a real redis-server on a free port, one sim worker and, in turn, two one-process
edges with every per-key limit on (requests/s, streams, tokens per minute; set high
enough never to refuse): one with the embedded store, one with `--store-url`. For each,
`--concurrency` clients send non-streamed chat completions (2 tokens) for `--seconds`
and it reports requests/s and the client's p50/p99 latency. The difference is the cost
of the store's round trips (rate take, lease acquire and release, token reserve and
settle: five Lua calls or commands per generation).

Results: scripts/results/limits.{json,md} (or --out DIR), with the command and commit.
Traffic goes to 127.0.0.1 only, bounded by --seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.integration.edge_fixtures import EDGE_ENV, wait_ready
from tests.procs import start_edge, start_worker
from tests.redis_proc import redis_server

KEY = "bench:sk-bench-0123456789abcdef"
LIMITS = ["--rate-limit", "100000", "--max-streams-per-key", "10000", "--tpm-limit", "100000000"]


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    env = {**EDGE_ENV, "SLUICE_API_KEYS": KEY}
    results: dict[str, Any] = {}
    with redis_server() as redis:
        worker = start_worker("--engine", "sim", "--sim-token-delay", "0")
        try:
            for name, extra in (("embedded", []), ("redis", ["--store-url", redis.url])):
                edge = start_edge("--worker", worker.address, *LIMITS, *extra, env=env)
                try:
                    base = f"http://{edge.address}"
                    wait_ready(base)
                    results[name] = asyncio.run(drive(base, args.concurrency, args.seconds))
                finally:
                    edge.kill()
        finally:
            worker.kill()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    doc = {
        "command": " ".join(["python -m scripts.limits_bench", *(argv or sys.argv[1:])]),
        "commit": commit.stdout.strip(),
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "results": results,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "limits.json").write_text(json.dumps(doc, indent=2) + "\n")
    rows = [
        f"| {n} | {r['rps']} | {r['p50_ms']} | {r['p99_ms']} | {r['non_200']} |"
        for n, r in results.items()
    ]
    md = [
        "# Limits: embedded store vs Redis (one edge process, every limit on)",
        "",
        f"`{doc['command']}` at {doc['commit']}, {args.concurrency} clients, "
        f"{args.seconds} s each, non-streamed chat completions of 2 tokens (sim worker).",
        "",
        "| store | requests/s | p50 ms | p99 ms | non-200 |",
        "| --- | --- | --- | --- | --- |",
        *rows,
        "",
    ]
    (out / "limits.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
