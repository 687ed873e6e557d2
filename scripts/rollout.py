"""Gray release over an edge's admin API: register the new version's workers as a pool,
wait until they serve, run a rollout plan, report.

    export SLUICE_ADMIN_KEY=...
    python -m scripts.rollout --edge http://127.0.0.1:8000 run --canary v2 --version 2.0 \\
        --worker 10.0.0.31:50051 --worker 10.0.0.32:50051 \\
        --steps 1,5,25,50,100 --hold 60 --min-samples 20 \\
        --max-error-rate-increase 0.02 --max-ttft-ratio 1.5 --max-itl-ratio 1.5

`run`: 1. `POST /admin/pools` (weight 0: no traffic yet) unless the pool exists already
(then the given workers are added to it); 2. wait until the edge reports every worker of
it routable (SERVING; `--ready-timeout`); 3. `POST /admin/rollouts`; 4. follow it,
printing each transition as it happens, until it finishes, rolls back or is aborted
(Ctrl-C aborts it). Exit 0 when it finished, 1 when it rolled back or was aborted, 2 on
a usage or API error.

Without a shared store, pools and rollouts live in each edge process, so with several
edges give `--edge` once per edge: each runs the plan on its own traffic, and the first
one that rolls back (or is aborted) makes this script abort the plan on all the others.
Edges sharing a store (`--store-url`) are one fleet: give one `--edge` (any replica);
the plan runs for all of them. (The session cookie
carries its pool, so a conversation keeps its version on whichever edge it reaches.)

The other commands act on rollouts already there: `status [ID]` (the active or named one,
with its history; `--all` for every one kept), `pause ID`, `resume ID`, `abort ID`,
`watch ID` (on the first `--edge`). Output is JSON lines: one per transition (`run`,
`watch`), one object otherwise. The admin key comes from `$SLUICE_ADMIN_KEY` or
`--admin-key-file`, never from the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ADMIN_KEY_ENV = "SLUICE_ADMIN_KEY"
ENDED = ("finished", "rolled_back", "aborted")


class ApiFailure(Exception):
    """The admin API said no (its error message is the text)."""


class Admin:
    def __init__(self, edge: str, key: str, timeout: float = 10.0) -> None:
        self.edge = edge
        headers = {"authorization": f"Bearer {key}"} if key else {}
        self.client = httpx.Client(base_url=edge.rstrip("/"), headers=headers, timeout=timeout)

    def call(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = ()) -> Any:
        resp = self.client.request(method, f"/admin{path}", json=body)
        if resp.status_code >= 400 and resp.status_code not in ok:
            try:
                message = resp.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = resp.text[:200]
            raise ApiFailure(f"{method} /admin{path}: {resp.status_code} {message}")
        return resp.json() if resp.content else None


def register(admin: Admin, pool: str, version: str, workers: list[str]) -> None:
    """The canary pool with weight 0 (or the workers added to it when it exists)."""
    existing = admin.call("GET", f"/pools/{pool}", ok=(404,))
    if existing is None or "error" in existing:
        spec = {"name": pool, "version": version, "weight": 0, "workers": workers}
        admin.call("POST", "/pools", spec)
        return
    known = {w["address"] for w in existing["workers"]}
    for address in workers:
        if address not in known:
            admin.call("POST", f"/pools/{pool}/workers", {"address": address})


def wait_routable(admin: Admin, pool: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        workers = admin.call("GET", f"/pools/{pool}")["workers"]
        if workers and all(w["routable"] for w in workers):
            return
        if time.monotonic() > deadline:
            states = {w["address"]: w["status"] for w in workers}
            raise ApiFailure(f"pool {pool}: not every worker serves after {timeout}s: {states}")
        time.sleep(0.2)


def follow(admin: Admin, rid: str, interval: float) -> dict[str, Any]:
    """Print each transition once as it appears; return the rollout once it ended."""
    shown = 0
    while True:
        rollout = admin.call("GET", f"/rollouts/{rid}")
        for entry in rollout["history"][shown:]:
            print(json.dumps({"rollout": rid, **entry}), flush=True)
        shown = len(rollout["history"])
        if rollout["state"] in ENDED:
            return dict(rollout)
        time.sleep(interval)


def plan_of(args: argparse.Namespace) -> dict[str, Any]:
    steps = [float(s) for s in args.steps.split(",") if s.strip()]
    analysis: dict[str, Any] = {"min_samples": args.min_samples}
    for name, value in (
        ("window_s", args.window),
        ("max_error_rate_increase", args.max_error_rate_increase),
        ("max_ttft_p99_ratio", args.max_ttft_ratio),
        ("max_itl_p99_ratio", args.max_itl_ratio),
        ("latency_slack_ms", args.latency_slack_ms),
    ):
        if value is not None:
            analysis[name] = value
    plan: dict[str, Any] = {
        "canary": args.canary,
        "steps": steps,
        "hold_s": args.hold,
        "analysis": analysis,
    }
    if args.stable:
        plan["stable"] = args.stable
    return plan


def run(admins: list[Admin], args: argparse.Namespace) -> int:
    for admin in admins:
        if args.worker:
            register(admin, args.canary, args.version, args.worker)
    for admin in admins:
        wait_routable(admin, args.canary, args.ready_timeout)
    rids = [admin.call("POST", "/rollouts", plan_of(args))["id"] for admin in admins]
    try:
        done = follow_all(admins, rids, args.interval)
    except KeyboardInterrupt:
        abort_all(admins, rids)
        done = follow_all(admins, rids, args.interval)
    for admin, rollout in zip(admins, done, strict=True):
        print(json.dumps({"edge": admin.edge, **report(rollout)}), flush=True)
    return 0 if all(r["state"] == "finished" for r in done) else 1


def follow_all(admins: list[Admin], rids: list[str], interval: float) -> list[dict[str, Any]]:
    """`follow` over several edges at once; one that ends badly aborts the others."""
    shown = [0] * len(admins)
    while True:
        rollouts = [a.call("GET", f"/rollouts/{r}") for a, r in zip(admins, rids, strict=True)]
        for i, rollout in enumerate(rollouts):
            for entry in rollout["history"][shown[i] :]:
                edge = {"edge": admins[i].edge} if len(admins) > 1 else {}
                print(json.dumps({**edge, "rollout": rids[i], **entry}), flush=True)
            shown[i] = len(rollout["history"])
        states = {r["state"] for r in rollouts}
        if states <= set(ENDED):
            return rollouts
        if states & {"rolled_back", "aborted"}:
            abort_all(admins, rids)
        time.sleep(interval)


def abort_all(admins: list[Admin], rids: list[str]) -> None:
    for admin, rid in zip(admins, rids, strict=True):
        admin.call("POST", f"/rollouts/{rid}/abort", ok=(409,))


def report(rollout: dict[str, Any]) -> dict[str, Any]:
    """The summary line: outcome, and per step how long it held and how it compared."""
    steps = [
        {
            "percent": e["percent"],
            "held_s": e["held_s"],
            "applied_late_ms": e.get("applied_late_ms"),
            "canary": e["canary"],
            "stable": e["stable"],
        }
        for e in rollout["history"]
        if e["event"] in ("advanced", "finished", "rolled_back", "aborted")
    ]
    return {
        "rollout": rollout["id"],
        "state": rollout["state"],
        "reason": rollout["reason"],
        "canary": rollout["plan"]["canary"],
        "stable": rollout["plan"]["stable"],
        "steps": steps,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--edge", action="append", required=True, help="edge base URL (repeat: every edge)"
    )
    p.add_argument("--admin-key-file", default="", help=f"else ${ADMIN_KEY_ENV}")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between polls")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="register the canary's workers, run a plan, report")
    r.add_argument("--canary", required=True, help="the new version's pool")
    r.add_argument("--stable", default="", help="the pool it replaces (default: the other)")
    r.add_argument("--version", default="", help="version label of a new canary pool")
    r.add_argument("--worker", action="append", default=[], help="canary worker host:port")
    r.add_argument("--steps", default="1,5,25,50,100", help="canary %% per step, ending at 100")
    r.add_argument("--hold", type=float, default=60.0, help="seconds per step")
    r.add_argument("--window", type=float, default=None, help="analysis window, s (hold)")
    r.add_argument("--min-samples", type=int, default=20, help="canary outcomes to judge")
    r.add_argument("--max-error-rate-increase", type=float, default=None)
    r.add_argument("--max-ttft-ratio", type=float, default=None, help="p99 TTFT vs stable")
    r.add_argument("--max-itl-ratio", type=float, default=None, help="p99 ITL vs stable")
    r.add_argument("--latency-slack-ms", type=float, default=None)
    r.add_argument("--ready-timeout", type=float, default=900.0, help="s for workers to serve")
    s = sub.add_parser("status", help="the active (or named) rollout")
    s.add_argument("id", nargs="?", default="")
    s.add_argument("--all", action="store_true", help="every rollout the edge keeps")
    for verb in ("pause", "resume", "abort", "watch"):
        sub.add_parser(verb, help=f"{verb} a rollout").add_argument("id")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    key_file = args.admin_key_file
    key = Path(key_file).read_text().strip() if key_file else os.environ.get(ADMIN_KEY_ENV, "")
    admins = [Admin(edge, key) for edge in args.edge]
    admin = admins[0]  # the other commands act on one edge (the first)
    try:
        if args.command == "run":
            return run(admins, args)
        if args.command == "watch":
            done = follow(admin, args.id, args.interval)
            print(json.dumps(report(done)), flush=True)
            return 0 if done["state"] == "finished" else 1
        if args.command == "status":
            listed = admin.call("GET", "/rollouts")
            rid = args.id or listed["active"]
            if args.all or not rid:
                print(json.dumps(listed))
            else:
                print(json.dumps(admin.call("GET", f"/rollouts/{rid}")))
            return 0
        print(json.dumps(admin.call("POST", f"/rollouts/{args.id}/{args.command}")))
        return 0
    except (ApiFailure, httpx.HTTPError) as exc:
        print(f"rollout: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
