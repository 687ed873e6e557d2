"""Rollout benchmark: a whole gray release under multi-turn load, on sim workers.

    python -m scripts.rollout_bench                       # ~35 s; results in scripts/results
    python -m scripts.rollout_bench --hold 10 --conversations 32 --out /tmp

Starts three sim workers (two in pool `stable`, one in pool `canary`, weight 0) and an
edge with an admin key, runs `--conversations` browser-like dialogues at a time (each its
own cookie jar, `--turns` streamed turns, then a new one), and starts a rollout plan
(`--steps`, `--hold` s per step) once the load runs. It reports:

- requests during the rollout and how many failed (goal 0: a non-200 or a stream without
  `[DONE]`), and conversations that changed pool mid-dialogue before the plan ended
  (goal 0; at its end the old pool drains and a dialogue still on it moves once);
- per step: its share, how long it held, the client-measured p99 TTFT (first content
  token) of the requests it started on the stable pool and on the canary, and the
  edge's own p99 TTFT per pool over the step (from the rollout's history);
- the time each step took to apply: how late the edge applied it after it was due (held,
  enough samples), and when a client polling `GET /admin/pools` every 20 ms saw the new
  weight, after it was due.

Results: scripts/results/rollout.{json,md} (or --out DIR), with the command and commit.
Traffic goes to 127.0.0.1 only; the run ends with the plan (bounded by --limit).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
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
from tests.procs import start_edge, start_worker  # noqa: E402

CHAT = "/v1/chat/completions"
ADMIN_KEY = "rollout-bench-admin-key"
AUTH = {"authorization": f"Bearer {ADMIN_KEY}"}
WORKER_ARGS = ("--engine", "sim", "--sim-ttft", "0.02", "--sim-token-delay", "0.005")


@dataclass(frozen=True, slots=True)
class Options:
    steps: str = shared.steps()
    hold: float = shared.hold(4.0)
    min_samples: int = shared.min_samples(5)
    conversations: int = option(16, "--conversations", "dialogues at a time")
    turns: int = option(4, "--turns", "turns per dialogue")
    tokens: int = shared.tokens(16, "max_tokens per turn")
    warmup: float = shared.warmup_s(2.0, "s of load before the plan")
    limit: float = option(120.0, "--limit", "s before the plan is aborted")
    out: Path = shared.results_dir()


@dataclass
class Request:
    conversation: int
    started: float  # time.time()
    pool: str
    ok: bool
    ttft_s: float | None
    moved: bool


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def one_turn(
    client: httpx.AsyncClient, base: str, conv: int, messages: list[dict[str, str]], tokens: int
) -> Request:
    body = {"messages": messages, "max_tokens": tokens, "stream": True}
    started, t0 = time.time(), time.perf_counter()
    ttft, done, pool, moved, status = None, False, "", False, 0
    try:
        async with client.stream("POST", f"{base}{CHAT}", json=body) as resp:
            status = resp.status_code
            pool = resp.headers.get("x-sluice-pool", "")
            moved = "x-sluice-session-moved" in resp.headers
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                elif ttft is None:
                    choices = orjson.loads(data).get("choices") or [{}]
                    if choices[0].get("delta", {}).get("content"):
                        ttft = time.perf_counter() - t0
    except httpx.HTTPError:
        pass
    return Request(conv, started, pool, status == 200 and done, ttft, moved)


async def conversations(base: str, opts: Options, out: list[Request], stop: asyncio.Event) -> None:
    counter = iter(range(1 << 30))

    async def loop() -> None:
        while not stop.is_set():
            conv = next(counter)
            messages: list[dict[str, str]] = []
            async with httpx.AsyncClient(timeout=30) as client:  # its own cookie jar
                for i in range(opts.turns):
                    messages.append({"role": "user", "content": f"turn {i} of {conv}"})
                    out.append(await one_turn(client, base, conv, messages, opts.tokens))
                    messages.append({"role": "assistant", "content": "ok"})

    await asyncio.gather(*(loop() for _ in range(opts.conversations)))


async def watch_weights(
    base: str, pool: str, seen: dict[float, float], stop: asyncio.Event
) -> None:
    async with httpx.AsyncClient(timeout=10) as c:
        while not stop.is_set():
            resp = await c.get(f"{base}/admin/pools", headers=AUTH)
            now = time.time()
            for p in resp.json()["pools"]:
                if p["name"] == pool:
                    seen.setdefault(p["weight"], now)
            await asyncio.sleep(0.02)


async def run(base: str, opts: Options) -> dict[str, Any]:
    requests: list[Request] = []
    seen: dict[float, float] = {}
    stop = asyncio.Event()
    load = asyncio.create_task(conversations(base, opts, requests, stop))
    watcher = asyncio.create_task(watch_weights(base, "canary", seen, stop))
    await asyncio.sleep(opts.warmup)
    plan = {
        "canary": "canary",
        "stable": "stable",
        "steps": shared.percents(opts.steps),
        "hold_s": opts.hold,
        "analysis": {"min_samples": opts.min_samples, "latency_slack_ms": 50},
    }
    async with httpx.AsyncClient(timeout=10) as c:
        resp = await c.post(f"{base}/admin/rollouts", json=plan, headers=AUTH)
        resp.raise_for_status()
        rid = resp.json()["id"]
        began = time.time()
        deadline = time.monotonic() + opts.limit
        while True:
            rollout = (await c.get(f"{base}/admin/rollouts/{rid}", headers=AUTH)).json()
            if rollout["state"] in ("finished", "rolled_back", "aborted"):
                break
            if time.monotonic() > deadline:
                await c.post(f"{base}/admin/rollouts/{rid}/abort", headers=AUTH)
                rollout = (await c.get(f"{base}/admin/rollouts/{rid}", headers=AUTH)).json()
                break
            await asyncio.sleep(0.1)
    ended = time.time()
    stop.set()
    await asyncio.gather(load, watcher)
    return summarize(rollout, requests, seen, began, ended)


def summarize(
    rollout: dict[str, Any],
    requests: list[Request],
    seen: dict[float, float],
    began: float,
    ended: float,
) -> dict[str, Any]:
    history = rollout["history"]
    during = [r for r in requests if began <= r.started <= ended]
    # Until the plan ended: at its end the old stable pool drains, and a dialogue still on
    # it moves once (told so by a header), as designed; those are counted apart.
    last = history[-1]["at"]
    by_conv: dict[int, set[str]] = {}
    for r in requests:
        if r.started < last:
            by_conv.setdefault(r.conversation, set()).add(r.pool)
    steps = []
    entered = history[0]["at"]
    for entry in history[1:]:
        span = [r for r in requests if entered <= r.started < entry["at"]]
        row: dict[str, Any] = {
            "percent": entry["percent"],
            "held_s": entry["held_s"],
            "requests": len(span),
            "applied_late_ms": entry.get("applied_late_ms"),
        }
        for pool in ("stable", "canary"):
            ttfts = [r.ttft_s for r in span if r.pool == pool and r.ttft_s is not None]
            value = p99(ttfts)
            row[f"{pool}_requests"] = sum(r.pool == pool for r in span)
            row[f"{pool}_p99_ttft_ms"] = None if value is None else round(value * 1000, 1)
            row[f"edge_{pool}_p99_ttft_ms"] = entry[pool]["ttft_p99_ms"]
        if entry.get("applied_late_ms") is not None and entry["event"] == "advanced":
            due = entry["at"] - entry["applied_late_ms"] / 1000
            nxt = rollout["plan"]["steps"][entry["step"] + 1]
            row["seen_after_due_ms"] = round((seen[nxt] - due) * 1000, 1) if nxt in seen else None
        steps.append(row)
        entered = entry["at"]
    return {
        "state": rollout["state"],
        "reason": rollout["reason"],
        "plan": rollout["plan"],
        "rollout_s": round(ended - began, 2),
        "requests_during": len(during),
        "failed": sum(not r.ok for r in during),
        "failed_all_run": sum(not r.ok for r in requests),
        "conversations": len(by_conv),
        "switched_pool_mid_dialogue": sum(len(p) > 1 for p in by_conv.values()),
        "moved_after_the_end": sum(r.moved for r in requests if r.started >= last),
        "steps": steps,
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Rollout under load",
        "",
        f"`{result['command']}` at {result['commit']} ({result['machine']})",
        "",
        f"- rollout: {result['state']} in {result['rollout_s']} s "
        f"(steps {result['plan']['steps']}, hold {result['plan']['hold_s'][0]} s each)",
        f"- requests during the rollout: {result['requests_during']}, failed: "
        f"{result['failed']} (goal 0); in the whole run: {result['failed_all_run']} failed",
        f"- conversations: {result['conversations']}, switched pool mid-dialogue: "
        f"{result['switched_pool_mid_dialogue']} (goal 0); moved by the old pool's drain "
        f"after the end: {result['moved_after_the_end']}",
        "",
        "| step % | held s | requests (stable / canary) | p99 TTFT ms stable / canary "
        "(client) | (edge) | applied late ms | seen via admin API ms after due |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in result["steps"]:
        lines.append(
            f"| {s['percent']:g} | {s['held_s']} | {s['stable_requests']} / "
            f"{s['canary_requests']} | {s['stable_p99_ttft_ms']} / {s['canary_p99_ttft_ms']} | "
            f"{s['edge_stable_p99_ttft_ms']} / {s['edge_canary_p99_ttft_ms']} | "
            f"{s['applied_late_ms']} | {s.get('seen_after_due_ms', '-')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_section(ap, "rollout", Options)
    opts = section_from(ap.parse_args(), "rollout", Options)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    workers = [start_worker(*WORKER_ARGS, wait=False) for _ in range(3)]
    edge = None
    try:
        pools = opts.out / "rollout-pools.json"
        opts.out.mkdir(parents=True, exist_ok=True)
        pools.write_text(
            json.dumps(
                [
                    {"name": "stable", "version": "v1", "weight": 1,
                     "workers": [workers[0].address, workers[1].address]},
                    {"name": "canary", "version": "v2", "weight": 0,
                     "workers": [workers[2].address]},
                ]
            )
        )  # fmt: skip
        env = {"SLUICE_ADMIN_KEY": ADMIN_KEY, "SLUICE_RESUME_SECRET": os.urandom(16).hex()}
        edge = start_edge("--pools", str(pools), env=env)
        base = f"http://{edge.address}"
        deadline = time.monotonic() + 30
        while not all(
            w["routable"]
            for p in httpx.get(f"{base}/admin/pools", headers=AUTH).json()["pools"]
            for w in p["workers"]
        ):
            assert time.monotonic() < deadline, "workers did not become routable"
            time.sleep(0.05)
        result = asyncio.run(run(base, opts))
    finally:
        if edge is not None:
            edge.kill()
        for w in workers:
            w.kill()
        (opts.out / "rollout-pools.json").unlink(missing_ok=True)
    result["command"] = "python -m scripts.rollout_bench " + " ".join(sys.argv[1:])
    result["commit"], result["machine"] = commit, f"{platform.machine()}, {os.cpu_count()} cores"
    (opts.out / "rollout.json").write_text(json.dumps(result, indent=1))
    text = markdown(result)
    (opts.out / "rollout.md").write_text(text)
    print(text)
    ok = result["state"] == "finished" and not result["failed"]
    return 0 if ok and not result["switched_pool_mid_dialogue"] else 1


if __name__ == "__main__":
    sys.exit(main())
