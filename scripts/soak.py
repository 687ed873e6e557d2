"""Soak: mixed traffic against a sim stack for a long time, watching for drift and leaks.

    python -m scripts.soak --minutes 30            # starts a sim worker and an edge
    python -m scripts.soak --minutes 1 --out /tmp  # a quick look

Traffic, at a modest steady rate (a soak, not a load test), from `--clients` loops:
streams read to the end, streams dropped mid-way, streams resumed with Last-Event-ID,
non-streamed requests, and bad inputs (each must get a 4xx with an OpenAI error object).
Every minute it records, per process (worker, edge), RSS and CPU, and the p99 latency of
the streams of that minute. At the end: errors by kind (anything unexpected is an error:
a 5xx, a cut stream, a bad input not refused), p99 drift (last minutes over first
minutes), and the RSS slope of every process (least squares over the minutes after the
first, MB/s). Results: scripts/results/soak.{json,md} (or --out DIR), with the command.
Traffic goes to 127.0.0.1 only; the run is bounded by --minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts import options as shared  # noqa: E402
from sluice_common.options import add_section, option, section_from  # noqa: E402
from tests.procs import Proc, start_edge, start_worker  # noqa: E402

CHAT = "/v1/chat/completions"
BAD = [
    {"messages": "not a list"},
    {"messages": [{"role": "wizard", "content": "x"}]},
    {"messages": [{"role": "user", "content": "x"}], "max_tokens": -1},
    {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
    {"prompt": 5},
]


@dataclass(frozen=True, slots=True)
class Options:
    minutes: float = option(30.0, "--minutes", "how long the traffic runs")
    clients: int = option(8, "--clients", "client loops, each one request at a time")
    sample_s: float = option(60.0, "--sample-s", "seconds per sample")
    out: Path = shared.results_dir()


@dataclass
class Minute:
    latencies_ms: list[float] = field(default_factory=list)
    requests: int = 0


@dataclass
class Soak:
    base: str
    errors: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    minute: Minute = field(default_factory=Minute)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def count(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.minute.requests += 1


def body(n: int, stream: bool = True) -> dict[str, Any]:
    content = f"Tell me about rivers, {random.randrange(1000)}."
    return {"messages": [{"role": "user", "content": content}], "max_tokens": n,
            "min_tokens": n, "temperature": 0, "stream": stream}  # fmt: skip


async def read_stream(
    s: Soak,
    c: httpx.AsyncClient,
    payload: dict[str, Any],
    stop_after: int = 0,
    headers: dict[str, str] | None = None,
) -> list[str]:
    """The ids of the events read; checks the stream ended whole (or was dropped)."""
    ids: list[str] = []
    t0 = time.monotonic()
    async with c.stream("POST", f"{s.base}{CHAT}", json=payload, headers=headers) as r:
        if r.status_code != 200:
            s.error(f"http_{r.status_code}")
            return ids
        done = False
        async for line in r.aiter_lines():
            if line.startswith("id: "):
                ids.append(line[4:])
            elif line == "data: [DONE]":
                done = True
            elif line.startswith("event: error"):
                s.error("error_event")
            if stop_after and len(ids) >= stop_after:
                return ids  # dropped mid-way on purpose
    if not done:
        s.error("stream_cut")
    s.minute.latencies_ms.append((time.monotonic() - t0) * 1000)
    return ids


async def client_loop(s: Soak, until: float, seed: int) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=60) as c:
        while time.monotonic() < until:
            kind = rng.choices(["stream", "drop", "resume", "whole", "bad"], [4, 2, 2, 1, 1])[0]
            try:
                if kind == "stream":
                    await read_stream(s, c, body(rng.randrange(5, 60)))
                elif kind == "drop":
                    await read_stream(s, c, body(200), stop_after=rng.randrange(2, 10))
                elif kind == "resume":
                    payload = body(40)
                    ids = await read_stream(s, c, payload, stop_after=rng.randrange(2, 20))
                    if ids:
                        await read_stream(s, c, payload, headers={"last-event-id": ids[-1]})
                elif kind == "whole":
                    r = await c.post(f"{s.base}{CHAT}", json=body(20, stream=False))
                    if r.status_code != 200 or not r.json()["choices"][0]["message"]["content"]:
                        s.error(f"whole_{r.status_code}")
                else:
                    r = await c.post(f"{s.base}{CHAT}", json=rng.choice(BAD))
                    if not (400 <= r.status_code < 500 and "error" in r.json()):
                        s.error(f"bad_input_{r.status_code}")
                s.count(kind)
            except httpx.HTTPError as err:
                s.error(type(err).__name__)
            await asyncio.sleep(rng.uniform(0.0, 0.05))


def proc_sample(pid: int) -> tuple[float, float]:
    """(RSS MB, CPU seconds) of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / tick
    with open(f"/proc/{pid}/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    return rss, cpu


def slope(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(0.99 * len(v)))]


async def run(opts: Options, procs: dict[str, Proc], base: str) -> dict[str, Any]:
    s = Soak(base)
    t0 = time.monotonic()
    until = t0 + opts.minutes * 60
    loops = [asyncio.create_task(client_loop(s, until, i)) for i in range(opts.clients)]
    samples: list[dict[str, Any]] = []
    while time.monotonic() < until:
        await asyncio.sleep(min(opts.sample_s, max(0.0, until - time.monotonic())))
        minute, s.minute = s.minute, Minute()
        row: dict[str, Any] = {"t_s": round(time.monotonic() - t0, 1),
                               "requests": minute.requests,
                               "p99_ms": p99(minute.latencies_ms)}  # fmt: skip
        for name, p in procs.items():
            rss, cpu = proc_sample(p.pid)
            row[f"{name}_rss_mb"], row[f"{name}_cpu_s"] = round(rss, 2), round(cpu, 2)
        samples.append(row)
        print(json.dumps(row), file=sys.stderr)
    await asyncio.gather(*loops)
    steady = samples[1:] or samples  # the first interval warms caches and allocators
    out: dict[str, Any] = {"errors": s.errors, "requests": s.counts, "samples": samples}
    for name in procs:
        xs = [r["t_s"] for r in steady]
        out[f"{name}_rss_slope_mb_per_s"] = round(
            slope(xs, [r[f"{name}_rss_mb"] for r in steady]), 5
        )
    p99s = [r["p99_ms"] for r in steady if r["p99_ms"] is not None]
    k = max(1, len(p99s) // 3)
    if p99s:
        first, last = sorted(p99s[:k])[k // 2], sorted(p99s[-k:])[k // 2]
        out["p99_first_ms"], out["p99_last_ms"] = round(first, 1), round(last, 1)
        out["p99_drift"] = round(last / first, 3) if first else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_section(ap, "soak", Options)
    opts = section_from(ap.parse_args(), "soak", Options)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()  # the code the processes start from
    worker = start_worker("--engine", "sim", "--sim-token-delay", "0.005",
                          "--default-detach-grace", "5")  # fmt: skip
    edge = start_edge("--worker", worker.address, "--openai-detach-grace", "5",
                      env={"SLUICE_RESUME_SECRET": os.urandom(16).hex()})  # fmt: skip
    try:
        base = f"http://{edge.address}"
        deadline = time.monotonic() + 20
        while httpx.get(f"{base}/readyz").status_code != 200:
            assert time.monotonic() < deadline, "the edge did not get ready"
            time.sleep(0.05)
        result = asyncio.run(run(opts, {"worker": worker, "edge": edge}, base))
    finally:
        edge.kill()
        worker.kill()
    result["command"] = "python -m scripts.soak " + " ".join(sys.argv[1:])
    result["commit"], result["machine"] = commit, f"{platform.machine()}, {os.cpu_count()} cores"
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "soak.json").write_text(json.dumps(result, indent=1))
    lines = [
        "# Soak", "", f"`{result['command']}` at {commit} ({result['machine']})", "",
        f"- requests by kind: {result['requests']}",
        f"- errors: {result['errors'] or 0}",
        f"- p99 stream latency: first third {result.get('p99_first_ms')} ms, last third "
        f"{result.get('p99_last_ms')} ms (drift {result.get('p99_drift')})",
        f"- RSS slope: worker {result['worker_rss_slope_mb_per_s']} MB/s, edge "
        f"{result['edge_rss_slope_mb_per_s']} MB/s (goal < 0.1 for each)",
        "", "| t (s) | requests | p99 ms | worker RSS MB | edge RSS MB |",
        "| ---: | ---: | ---: | ---: | ---: |",
        *(f"| {r['t_s']} | {r['requests']} | {r['p99_ms'] and round(r['p99_ms'], 1)} | "
          f"{r['worker_rss_mb']} | {r['edge_rss_mb']} |" for r in result["samples"]),
    ]  # fmt: skip
    (opts.out / "soak.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
