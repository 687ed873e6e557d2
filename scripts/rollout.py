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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from scripts import options as shared
from sluice_common.options import add_section, option, section_from

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


@dataclass
class Fleet:
    """The edges every command talks to."""

    edge: list[str] = option(
        [], "--edge", "edge base URL (repeat: every edge)", action="append", required=True
    )
    admin_key_file: str = shared.admin_key_file()
    interval: float = option(0.5, "--interval", "seconds between polls")


@dataclass
class Release:
    """`run`'s options: the canary pool, its workers and the plan."""

    canary: str = option("", "--canary", "the new version's pool", required=True)
    stable: str = option("", "--stable", "the pool it replaces (default: the other)")
    version: str = option("", "--version", "version label of a new canary pool")
    worker: list[str] = option([], "--worker", "canary worker host:port", action="append")
    steps: str = shared.steps()
    hold: float = shared.hold(60.0)
    window: float | None = option(None, "--window", "analysis window, s (hold)", type=float)
    min_samples: int = shared.min_samples(20)
    # Unset: the edge's defaults (edge/upstream/plans.py).
    max_error_rate_increase: float | None = option(
        None, "--max-error-rate-increase", "canary's error rate minus stable's, at most", type=float
    )
    max_ttft_ratio: float | None = option(
        None, "--max-ttft-ratio", "p99 TTFT vs stable", type=float
    )
    max_itl_ratio: float | None = option(None, "--max-itl-ratio", "p99 ITL vs stable", type=float)
    latency_slack_ms: float | None = option(
        None,
        "--latency-slack-ms",
        "a latency bound also needs the canary this many ms worse",
        type=float,
    )
    ready_timeout: float = option(900.0, "--ready-timeout", "s for workers to serve")

    def plan(self) -> dict[str, Any]:
        """The plan `POST /admin/rollouts` takes (unset analysis fields: the edge's)."""
        analysis: dict[str, Any] = {"min_samples": self.min_samples}
        for name, value in (
            ("window_s", self.window),
            ("max_error_rate_increase", self.max_error_rate_increase),
            ("max_ttft_p99_ratio", self.max_ttft_ratio),
            ("max_itl_p99_ratio", self.max_itl_ratio),
            ("latency_slack_ms", self.latency_slack_ms),
        ):
            if value is not None:
                analysis[name] = value
        plan: dict[str, Any] = {
            "canary": self.canary,
            "steps": shared.percents(self.steps),
            "hold_s": self.hold,
            "analysis": analysis,
        }
        if self.stable:
            plan["stable"] = self.stable
        return plan


@dataclass
class Status:
    all: bool = option(False, "--all", "every rollout the edge keeps", action="store_true")


@dataclass
class Args(Fleet, Release, Status):
    """A parsed command line: the command, the rollout it names, and every option (the
    defaults where the command has none)."""

    command: str = ""
    id: str = ""


# Section -> its dataclass, and the subcommand whose parser has it ("": every command).
SECTIONS: dict[str, tuple[str, type]] = {
    "fleet": ("", Fleet),
    "run": ("run", Release),
    "status": ("status", Status),
}


def run(admins: list[Admin], args: Args) -> int:
    for admin in admins:
        if args.worker:
            register(admin, args.canary, args.version, args.worker)
    for admin in admins:
        wait_routable(admin, args.canary, args.ready_timeout)
    rids = [admin.call("POST", "/rollouts", args.plan())["id"] for admin in admins]
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


def parse_args(argv: list[str] | None) -> Args:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    parsers = {
        "": p,
        "run": sub.add_parser("run", help="register the canary's workers, run a plan, report"),
        "status": sub.add_parser("status", help="the active (or named) rollout"),
    }
    parsers["status"].add_argument("id", nargs="?", default="")
    for verb in ("pause", "resume", "abort", "watch"):
        sub.add_parser(verb, help=f"{verb} a rollout").add_argument("id")
    for name, (command, cls) in SECTIONS.items():
        add_section(parsers[command], name, cls)
    ns = p.parse_args(argv)
    values: dict[str, Any] = {"command": ns.command, "id": getattr(ns, "id", "")}
    for name, (command, cls) in SECTIONS.items():
        if command in ("", ns.command):
            values.update(vars(section_from(ns, name, cls)))
    return Args(**values)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    key_file = args.admin_key_file
    key = (
        Path(key_file).read_text().strip() if key_file else os.environ.get(shared.ADMIN_KEY_ENV, "")
    )
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
