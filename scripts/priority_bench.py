"""Priority and fair-share benchmark: floods at 3x a sim worker's capacity, through the edge.

    python -m scripts.priority_bench                  # ~3 min; results in scripts/results
    python -m scripts.priority_bench --duration 10 --out /tmp

Starts one sim worker (`--slots` batch slots, as many places queued, `--headroom` slots
kept for a higher class in use) and an edge with four API keys: `interactive` (class
high), `batch` (low), `tenant-a` and `tenant-b` (normal). Every phase is open-loop
(Poisson arrivals, a seeded generator), streamed chat requests of `--tokens` tokens
(`ignore_eos`), measured for `--duration` s after `--warmup` s of the same load:

1. `fair_equal`: tenant-a and tenant-b each offer 1.5x capacity. Goal: equal shares of
   the completed requests (each 50 % +- 10 % of them).
2. `fair_unequal`: tenant-a offers 2.5x capacity, tenant-b 0.5x: b asks for less than
   half, so all of it should be served (FIFO admission would serve about 1/3 of it).
3. `flood_one_class`: batch offers 3x capacity at low priority, and the interactive key's
   probes (`--probe-rate`/s) come as low too (X-Sluice-Priority: low): fair share still
   admits them (another tenant), but they wait in the queue with the flood.
4. `unloaded`: the probes alone, as high: the reference TTFT.
5. `flood`: the low flood again, probes as high. Goal: every probe admitted, p99 TTFT
   within 1.5x of `unloaded`'s.
6. `flood_auto_headroom`: the same with the worker's default, automatic headroom (room
   for high to reach one more than its recent peak): no tuning.

Each phase runs on a fresh worker and edge, so no class is in use when it starts.

Capacity is slots / (ttft + (tokens - 1) x token delay), the sim's own service time.
Results: scripts/results/priority.{json,md} (or --out DIR), with the command and commit.
Traffic goes to 127.0.0.1 only, bounded by the phases' durations.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts import options as shared  # noqa: E402
from sluice_common.options import add_section, option, section_from  # noqa: E402
from tests.integration.edge_fixtures import wait_ready  # noqa: E402
from tests.procs import Proc, start_edge, start_worker  # noqa: E402

CHAT = "/v1/chat/completions"
KEYS = {name: f"sk-bench-{name}-{os.urandom(8).hex()}" for name in
        ("interactive", "batch", "tenant-a", "tenant-b")}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Options:
    slots: int = option(16, "--slots", "the sim worker's batch slots (as many queued)")
    headroom: int = option(4, "--headroom", "slots kept for a higher class")
    ttft: float = option(0.05, "--ttft", "the sim worker's seconds to the first token")
    token_delay: float = shared.token_delay(0.02)
    tokens: int = shared.tokens(40, "max_tokens per request (ignore_eos)")
    probe_rate: float = option(2.0, "--probe-rate", "high-priority requests/s")
    duration: float = shared.duration(20.0, "measured s per phase")
    warmup: float = shared.warmup_s(4.0)
    seed: int = shared.seed(7)
    out: Path = shared.results_dir()

    @property
    def capacity(self) -> float:
        """Requests/s the sim worker completes: slots over its own service time."""
        return self.slots / (self.ttft + (self.tokens - 1) * self.token_delay)


@dataclass
class Result:
    key: str
    started: float  # perf_counter
    status: int = 0
    ttft_s: float | None = None
    done: bool = False


async def one(client: httpx.AsyncClient, key: str, tokens: int, headers: dict[str, str]) -> Result:
    body = {
        "messages": [{"role": "user", "content": f"{key} {random.random()}"}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }
    hdrs = {"authorization": f"Bearer {KEYS[key]}", **headers}
    res = Result(key, time.perf_counter())
    try:
        async with client.stream("POST", CHAT, json=body, headers=hdrs) as resp:
            res.status = resp.status_code
            if resp.status_code != 200:
                await resp.aread()
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    res.done = True
                elif res.ttft_s is None:
                    choices = orjson.loads(data).get("choices") or [{}]
                    if choices[0].get("delta", {}).get("content"):
                        res.ttft_s = time.perf_counter() - res.started
    except httpx.HTTPError:
        res.status = -1
    return res


async def arrivals(
    client: httpx.AsyncClient,
    rng: random.Random,
    rate: float,
    until: float,
    key: str,
    tokens: int,
    headers: dict[str, str],
    out: list[asyncio.Task[Result]],
) -> None:
    """Open loop: Poisson arrivals at `rate`/s until `until` (perf_counter)."""
    t = time.perf_counter()
    while True:
        t += rng.expovariate(rate)
        if t >= until:
            return
        await asyncio.sleep(max(0.0, t - time.perf_counter()))
        out.append(asyncio.create_task(one(client, key, tokens, headers)))


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)


async def phase(
    base: str, opts: Options, streams: list[tuple[str, float, dict[str, str]]]
) -> dict[str, Any]:
    """Run `streams` (key, rate/s, headers) together; summarize each key's requests
    started in the measured window."""
    rng = random.Random(opts.seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=512)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
        began = time.perf_counter()
        measured_from = began + opts.warmup
        until = measured_from + opts.duration
        tasks: list[asyncio.Task[Result]] = []
        await asyncio.gather(
            *(
                arrivals(client, rng, rate, until, key, opts.tokens, headers, tasks)
                for key, rate, headers in streams
            )
        )
        results = await asyncio.gather(*tasks)
    out: dict[str, Any] = {}
    window = [r for r in results if r.started >= measured_from]
    for key, rate, headers in streams:
        mine = [r for r in window if r.key == key]
        ok = [r for r in mine if r.status == 200 and r.done]
        ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
        out[key] = {
            "offered_per_s": rate,
            "sent": len(mine),
            "completed": len(ok),
            "refused_429": sum(r.status == 429 for r in mine),
            "other_failures": len(mine) - len(ok) - sum(r.status == 429 for r in mine),
            "admitted_fraction": round(len(ok) / len(mine), 3) if mine else None,
            "completed_per_s": round(len(ok) / opts.duration, 2),
            "ttft_p50_ms": pct(ttfts, 0.5),
            "ttft_p90_ms": pct(ttfts, 0.9),
            "ttft_p99_ms": pct(ttfts, 0.99),
            "headers": headers,
        }
    return out


def start_stack(opts: Options, keys_file: Path, headroom: int | None) -> tuple[Proc, Proc]:
    """A fresh sim worker (no class in use yet) and an edge in front of it; headroom
    None: the worker's automatic one."""
    fixed = [] if headroom is None else ["--priority-headroom", str(headroom)]
    worker = start_worker(
        "--engine", "sim", "--sim-ttft", str(opts.ttft), "--sim-token-delay",
        str(opts.token_delay), "--max-num-seqs", str(opts.slots), "--max-waiting",
        str(opts.slots), *fixed,
    )  # fmt: skip
    try:
        edge = start_edge(
            "--worker", worker.address, "--api-keys-file", str(keys_file),
            "--key-priority", "interactive=high", "--key-priority", "batch=low",
            "--max-tries", "1",
        )  # fmt: skip
        wait_ready(f"http://{edge.address}")
    except BaseException:
        worker.kill()
        raise
    return worker, edge


def run(opts: Options, keys_file: Path, capacity: float) -> dict[str, Any]:
    """Each phase on its own fresh stack: which classes are in use starts empty."""
    low = {"x-sluice-priority": "low"}
    flood = [("batch", 3 * capacity, {}), ("interactive", opts.probe_rate, {})]
    plan: list[tuple[str, int | None, list[tuple[str, float, dict[str, str]]]]] = [
        ("fair_equal", opts.headroom,
         [("tenant-a", 1.5 * capacity, {}), ("tenant-b", 1.5 * capacity, {})]),
        ("fair_unequal", opts.headroom,
         [("tenant-a", 2.5 * capacity, {}), ("tenant-b", 0.5 * capacity, {})]),
        ("flood_one_class", opts.headroom,
         [("batch", 3 * capacity, {}), ("interactive", opts.probe_rate, low)]),
        ("unloaded", opts.headroom, [("interactive", opts.probe_rate, {})]),
        ("flood", opts.headroom, flood),
        ("flood_auto_headroom", None, flood),
    ]  # fmt: skip
    phases = {}
    for name, headroom, streams in plan:
        worker, edge = start_stack(opts, keys_file, headroom)
        try:
            phases[name] = asyncio.run(phase(f"http://{edge.address}", opts, streams))
            phases[name]["headroom"] = "auto" if headroom is None else headroom
        finally:
            edge.kill()
            worker.kill()
        print(name, json.dumps(phases[name]), flush=True)
    return phases


def verdicts(phases: dict[str, Any]) -> dict[str, Any]:
    eq = phases["fair_equal"]
    a, b = eq["tenant-a"]["completed"], eq["tenant-b"]["completed"]
    share_a = a / (a + b) if a + b else 0.0
    unloaded = phases["unloaded"]["interactive"]["ttft_p99_ms"]
    flood = phases["flood"]["interactive"]
    ratio = flood["ttft_p99_ms"] / unloaded if unloaded and flood["ttft_p99_ms"] else None
    return {
        "equal_share_a": round(share_a, 3),
        "equal_shares_within_10pct": abs(share_a - 0.5) <= 0.05,
        "light_tenant_admitted_fraction": phases["fair_unequal"]["tenant-b"]["admitted_fraction"],
        "high_all_admitted_under_flood": flood["completed"] == flood["sent"],
        "high_p99_ttft_ratio_flood_vs_unloaded": None if ratio is None else round(ratio, 2),
        "high_p99_within_1_5x": ratio is not None and ratio <= 1.5,
        "low_completed_per_s_flood": flood_low(phases["flood"]),
        "low_completed_per_s_flood_auto_headroom": flood_low(phases["flood_auto_headroom"]),
        "high_p99_ttft_ms_flood_auto_headroom": (
            phases["flood_auto_headroom"]["interactive"]["ttft_p99_ms"]
        ),
        "high_p99_ratio_auto_headroom": ratio_of(phases, "flood_auto_headroom"),
    }


def ratio_of(phases: dict[str, Any], name: str) -> float | None:
    unloaded = phases["unloaded"]["interactive"]["ttft_p99_ms"]
    p99 = phases[name]["interactive"]["ttft_p99_ms"]
    return round(p99 / unloaded, 2) if unloaded and p99 else None


def flood_low(phase: dict[str, Any]) -> float:
    return float(phase["batch"]["completed_per_s"])


def markdown(result: dict[str, Any]) -> str:
    v, cfg = result["verdicts"], result["config"]
    lines = [
        "# Priority classes and fair share under a 3x flood",
        "",
        f"`{result['command']}` at {result['commit']} ({result['machine']})",
        "",
        f"Sim worker: {cfg['slots']} batch slots + {cfg['slots']} queued places, headroom "
        f"{cfg['headroom']} slots, TTFT {cfg['ttft_s']} s, {cfg['tokens']} tokens at "
        f"{cfg['token_delay_s']} s: capacity {cfg['capacity_per_s']:.1f} requests/s. "
        f"Each phase: {cfg['warmup_s']} s warm-up, {cfg['duration_s']} s measured, "
        "open-loop Poisson arrivals through the edge.",
        "",
        f"- equal floods (1.5x capacity each): tenant-a got {v['equal_share_a']:.1%} of "
        f"the completions (goal 50 % +- 5 points, i.e. +-10 %): "
        f"{'met' if v['equal_shares_within_10pct'] else 'NOT met'}",
        f"- unequal floods (2.5x vs 0.5x): the light tenant had "
        f"{v['light_tenant_admitted_fraction']:.1%} of its requests served "
        "(FIFO admission would serve about a third)",
        f"- low flood at 3x with high probes: all high admitted: "
        f"{v['high_all_admitted_under_flood']}; high p99 TTFT "
        f"{v['high_p99_ttft_ratio_flood_vs_unloaded']}x the unloaded p99 (goal <= 1.5x): "
        f"{'met' if v['high_p99_within_1_5x'] else 'NOT met'}",
        f"- the default, automatic headroom: high p99 TTFT "
        f"{v['high_p99_ttft_ms_flood_auto_headroom']} ms "
        f"({v['high_p99_ratio_auto_headroom']}x unloaded), the low class completing "
        f"{v['low_completed_per_s_flood_auto_headroom']}/s "
        f"({v['low_completed_per_s_flood']}/s with {cfg['headroom']} slots held back)",
        "",
        "| phase (headroom) | key | offered /s | sent | completed | 429 | other | served | "
        "done /s | TTFT p50 / p90 / p99 ms |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, keys in result["phases"].items():
        for key, r in keys.items():
            if key == "headroom":
                continue
            served = "-" if r["admitted_fraction"] is None else f"{r['admitted_fraction']:.1%}"
            cls = f" ({r['headers']['x-sluice-priority']})" if r["headers"] else ""
            lines.append(
                f"| {name} ({keys['headroom']}) | {key}{cls} | {r['offered_per_s']:.1f} | "
                f"{r['sent']} | "
                f"{r['completed']} | {r['refused_429']} | {r['other_failures']} | {served} | "
                f"{r['completed_per_s']} | {r['ttft_p50_ms']} / {r['ttft_p90_ms']} / "
                f"{r['ttft_p99_ms']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_section(ap, "priority", Options)
    opts = section_from(ap.parse_args(), "priority", Options)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    capacity = opts.capacity
    opts.out.mkdir(parents=True, exist_ok=True)
    keys_file = opts.out / "priority-keys"
    keys_file.write_text(
        "".join(f"{n}:sha256:{hashlib.sha256(k.encode()).hexdigest()}\n" for n, k in KEYS.items())
    )
    try:
        phases = run(opts, keys_file, capacity)
    finally:
        keys_file.unlink(missing_ok=True)
    result: dict[str, Any] = {
        "command": "python -m scripts.priority_bench " + " ".join(sys.argv[1:]),
        "commit": commit,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "config": {
            "slots": opts.slots,
            "headroom": opts.headroom,
            "ttft_s": opts.ttft,
            "token_delay_s": opts.token_delay,
            "tokens": opts.tokens,
            "capacity_per_s": round(capacity, 2),
            "probe_rate_per_s": opts.probe_rate,
            "duration_s": opts.duration,
            "warmup_s": opts.warmup,
        },
        "phases": phases,
    }
    result["verdicts"] = verdicts(phases)
    (opts.out / "priority.json").write_text(json.dumps(result, indent=1))
    text = markdown(result)
    (opts.out / "priority.md").write_text(text)
    print(text)
    v = result["verdicts"]
    goals = (v["equal_shares_within_10pct"], v["high_all_admitted_under_flood"])
    return 0 if all(goals) and v["high_p99_within_1_5x"] else 1


if __name__ == "__main__":
    sys.exit(main())
