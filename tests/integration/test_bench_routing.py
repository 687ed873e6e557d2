"""The benchmark's routing and decision modes end to end, small: sim workers with prefix
caches behind our edge's policies, on the multi-turn workload (vllm-router, the `[bench]`
extra, is left out), and the in-process timing of routing decisions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.procs import ROOT


def run(tmp_path: Path, name: str, *args: str) -> dict:
    cmd = [sys.executable, "-m", "scripts.bench", *args, "--out", str(tmp_path), "--name", name,
           "--no-progress", "--no-plot"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((tmp_path / f"{name}.json").read_text())


def test_routing_mode_compares_policies_on_conversations(tmp_path: Path) -> None:
    doc = run(
        tmp_path, "routing", "--mode", "routing", "--routing-targets", "cache_aware,random",
        "--routing-workers", "2", "--workload", "multiturn", "--users", "12", "--turns", "4",
        "--concurrency", "4", "--requests", "40", "--warmup", "8", "--prompt-tokens", "40",
        "--system-tokens", "80", "--output-tokens", "8", "--sim-token-delay", "0.002",
        "--sim-prefill-rate", "200000",
    )  # fmt: skip
    runs = {r["label"]: r for r in doc["runs"]}
    assert set(runs) == {"cache_aware #1", "random #1"}
    for label, r in runs.items():
        assert r["requests"]["ok"] == 40 and r["requests"]["errors"] == 0
        assert r["prefix_cache"]["prompt_tokens"] > 0
        shares = doc["worker_shares"][label]
        assert sum(shares["requests_per_worker"]) == 40 and shares["max_over_mean"] >= 1
        assert sum(r["served_by"].values()) == 40  # the edge names the worker of each
    assert runs["cache_aware #1"]["prefix_cache"]["hit_rate"] > 0.3
    assert sum(doc["worker_shares"]["cache_aware #1"]["decisions"].values()) == 40
    routing = doc["routing"]
    assert routing["cache_aware_over_random.hit_rate"] > 0
    assert routing["goal cache_aware max worker load <= 1.5x mean"] in ("met", "not met")
    assert "| routing | value |" in (tmp_path / "routing.md").read_text()


def test_decision_mode_times_every_policy(tmp_path: Path) -> None:
    # Small: the mode's own size (5 x 2,000 picks, four sizes up to 128,000 chars) takes 20 s.
    doc = run(tmp_path, "decision", "--mode", "decision", "--routing-workers", "4",
              "--decision-calls", "200", "--decision-sizes", "1000,8000")  # fmt: skip
    assert doc["workers"] == 4
    policies = ("cache_aware", "kv_aware", "session", "least_load", "random")
    assert set(doc["results"]) == {f"{p} {n} chars" for n in (1000, 8000) for p in policies}
    for figures in doc["results"].values():
        assert 0 < figures["p50_us"] <= figures["p99_us"]
    (goal, verdict) = doc["goal"].popitem()
    assert goal.endswith("up to 8,000 chars")
    assert verdict in ("met", "not met")
    assert all(f["cpu_us"] > 0 for f in doc["results"].values())
