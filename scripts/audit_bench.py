"""Audit-log benchmark: does a slow audit sink slow streams?

    python -m scripts.audit_bench                 # ~60 s; results in scripts/results
    python -m scripts.audit_bench --seconds 3 --rounds 1 --out /tmp

Starts one sim worker and four one-process edges: without an audit log; with
`--audit-log FILE` (lines without bodies); with `--audit-log FILE --audit-bodies
--audit-redact ...` (every line with its bodies, redacted); and the same to a named
pipe whose reader opens it and never reads it (the slowest sink there is: the writer
thread blocks once the pipe's 64 KiB are full,
the queue, `--audit-queue 256` here, fills, lines are dropped). In each of `--rounds`
rounds each edge in turn gets `--concurrency` clients streaming chat completions
(`--tokens` tokens) for `--seconds`;
it reports streams/s, the client's TTFT and whole-stream p50/p99, the edge's CPU per
stream, and the audit lines written and dropped. Medians over the rounds are the summary.

Results: scripts/results/audit.{json,md} (or --out DIR), with the command and commit.
Traffic goes to 127.0.0.1 only, bounded by --seconds x --rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from scripts import options as shared
from scripts.limits_bench import cpu_s
from sluice_common.options import add_section, option, section_from
from tests.integration.edge_fixtures import EDGE_ENV, wait_ready
from tests.procs import start_edge, start_worker

KEY = "bench:sk-bench-0123456789abcdef"
ADMIN = "bench-admin-key-0123456789"
REDACT = ["--audit-redact", "/request/messages/*/content", "--audit-redact", r"\d{16}"]
# A small queue, so that the stalled pipe fills it within a drive and drops.
AUDIT = ["--audit-bodies", *REDACT, "--audit-queue", "256"]
FIRST_TOKEN = re.compile(rb'"content":"[^"]')


@dataclass(frozen=True, slots=True)
class Options:
    seconds: float = option(8.0, "--seconds", "seconds per drive (one edge, one round)")
    rounds: int = shared.rounds(3, "rounds, each edge in turn (medians reported)")
    concurrency: int = shared.concurrency(16, "clients, each streaming back to back")
    tokens: int = shared.tokens(32)
    out: Path = shared.results_dir()


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(len(values) * q))] * 1000, 3)


async def drive(base: str, opts: Options) -> dict[str, float]:
    body = {
        "messages": [{"role": "user", "content": "card 4111111111111111, tell me a story"}],
        "max_tokens": opts.tokens,
        "stream": True,
    }
    headers = {"authorization": f"Bearer {KEY.split(':', 1)[1]}"}
    ttft: list[float] = []
    whole: list[float] = []
    bad = 0
    async with httpx.AsyncClient(timeout=30) as client:
        t0 = time.monotonic()

        async def loop() -> None:
            nonlocal bad
            while time.monotonic() - t0 < opts.seconds:
                t = time.perf_counter()
                first = None
                url = f"{base}/v1/chat/completions"
                async with client.stream("POST", url, json=body, headers=headers) as r:
                    async for chunk in r.aiter_bytes():
                        # The first token's event (the role chunk's content is empty).
                        if first is None and FIRST_TOKEN.search(chunk):
                            first = time.perf_counter() - t
                    bad += r.status_code != 200
                whole.append(time.perf_counter() - t)
                ttft.append(first if first is not None else whole[-1])

        await asyncio.gather(*(loop() for _ in range(opts.concurrency)))
        elapsed = time.monotonic() - t0
    return {
        "streams": len(whole),
        "non_200": bad,
        "streams_per_s": round(len(whole) / elapsed, 1),
        "ttft_p50_ms": pct(ttft, 0.5),
        "ttft_p99_ms": pct(ttft, 0.99),
        "stream_p50_ms": pct(whole, 0.5),
        "stream_p99_ms": pct(whole, 0.99),
    }


def audit_counts(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics", headers={"authorization": f"Bearer {ADMIN}"}).text
    out = {}
    for name in ("lines", "dropped"):
        head = f"sluice_edge_audit_{name}_total "
        found = [float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(head)]
        out[name] = found[0] if found else 0.0
    return out


def stalled_reader(fifo: Path, stop: threading.Event) -> threading.Thread:
    """Opens the pipe (so the writer's open returns) and never reads it."""

    def run() -> None:
        fd = os.open(fifo, os.O_RDONLY)
        stop.wait()
        os.close(fd)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_section(p, "audit", Options)
    opts = section_from(p.parse_args(argv), "audit", Options)
    env = {**EDGE_ENV, "SLUICE_API_KEYS": KEY}
    tmp = Path(tempfile.mkdtemp(prefix="sluice-audit-bench-"))
    fifo = tmp / "audit.fifo"
    os.mkfifo(fifo)
    stop = threading.Event()
    stalled_reader(fifo, stop)
    setups = {
        "no audit": [],
        "audit to a file, no bodies": ["--audit-log", str(tmp / "plain.log")],
        "audit to a file": ["--audit-log", str(tmp / "audit.log"), *AUDIT],
        "audit to a stalled pipe": ["--audit-log", str(fifo), *AUDIT],
    }
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in setups}
    worker = start_worker("--engine", "sim", "--sim-token-delay", "0.002")
    edges = {}
    try:
        for name, extra in setups.items():
            args = ["--worker", worker.address, "--admin-key", ADMIN, *extra]
            edges[name] = start_edge(*args, env=env)
            wait_ready(f"http://{edges[name].address}")
        for _ in range(opts.rounds):
            for name, edge in edges.items():
                base = f"http://{edge.address}"
                before, cpu0 = audit_counts(base), cpu_s(edge.pid)
                result = asyncio.run(drive(base, opts))
                used = cpu_s(edge.pid) - cpu0
                result["edge_cpu_us_per_stream"] = round(used / max(result["streams"], 1) * 1e6)
                after = audit_counts(base)
                result["audit_written"] = after["lines"] - before["lines"]
                result["audit_dropped"] = after["dropped"] - before["dropped"]
                rounds[name].append(result)
    finally:
        for edge in edges.values():
            edge.kill()
        worker.kill()
        stop.set()
    results = {
        name: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        for name, runs in rounds.items()
    }
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    doc = {
        "command": " ".join(["python -m scripts.audit_bench", *(argv or sys.argv[1:])]),
        "commit": commit.stdout.strip(),
        "concurrency": opts.concurrency,
        "tokens": opts.tokens,
        "seconds": opts.seconds,
        "rounds": rounds,
        "results": results,
    }
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "audit.json").write_text(json.dumps(doc, indent=2) + "\n")
    rows = [
        f"| {n} | {r['streams_per_s']} | {r['ttft_p50_ms']} | {r['ttft_p99_ms']} | "
        f"{r['stream_p50_ms']} | {r['stream_p99_ms']} | {r['edge_cpu_us_per_stream']} | "
        f"{r['audit_written']:g} | {r['audit_dropped']:g} | {r['non_200']:g} |"
        for n, r in results.items()
    ]
    md = [
        "# Audit log: a slow sink and streams (one edge process each)",
        "",
        f"`{doc['command']}` at {doc['commit']}, {opts.concurrency} clients streaming "
        f"{opts.tokens}-token chat completions back to back (sim worker, 2 ms a token), "
        f"{opts.seconds} s per drive, {opts.rounds} rounds alternating the edges (medians). "
        "Audit with bodies, two redaction rules and `--audit-queue 256`.",
        "",
        "| edge | streams/s | TTFT p50 ms | TTFT p99 ms | stream p50 ms | stream p99 ms "
        "| edge CPU µs/stream | audit lines written | dropped | non-200 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
    ]
    (out / "audit.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
