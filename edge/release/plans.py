"""Rollout plans, pure: what `POST /admin/rollouts` takes (`parse_plan`) and the judgement of
a canary against the stable pool (`judge`). A latency bound breaks only when the canary is
worse by the ratio *and* by the slack: a 2 ms TTFT doubling to 4 ms is noise."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from edge.obs.outcomes import WindowStats
from edge.routing.pools import PoolConfigError, count, number

MAX_STEPS = 100


@dataclass(slots=True)
class Analysis:
    """Bounds on the canary relative to the stable pool (`parse_plan`)."""

    min_samples: int = 20
    window_s: float | None = None  # None: the step's hold time
    max_error_rate_increase: float | None = 0.02
    max_ttft_p99_ratio: float | None = 1.5
    max_itl_p99_ratio: float | None = 1.5
    latency_slack_ms: float = 20.0

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]


@dataclass(slots=True)
class Plan:
    canary: str
    stable: str  # "" until resolved against the registry
    steps: list[float]
    hold_s: list[float]  # one per step
    analysis: Analysis

    def to_dict(self) -> dict[str, Any]:
        return {
            "canary": self.canary,
            "stable": self.stable,
            "steps": self.steps,
            "hold_s": self.hold_s,
            "analysis": self.analysis.to_dict(),
        }


def parse_analysis(raw: Any) -> Analysis:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise PoolConfigError("analysis must be an object")
    unknown = set(raw) - set(Analysis.__slots__)  # type: ignore[attr-defined]
    if unknown:
        raise PoolConfigError(f"unknown analysis keys: {sorted(unknown)}")
    d = Analysis()
    return Analysis(
        min_samples=count(raw, "min_samples", d.min_samples),
        window_s=number(raw, "window_s", None, 0.1, 3600),
        max_error_rate_increase=number(
            raw, "max_error_rate_increase", d.max_error_rate_increase, 0, 1
        ),
        max_ttft_p99_ratio=number(raw, "max_ttft_p99_ratio", d.max_ttft_p99_ratio, 1),
        max_itl_p99_ratio=number(raw, "max_itl_p99_ratio", d.max_itl_p99_ratio, 1),
        latency_slack_ms=number(raw, "latency_slack_ms", d.latency_slack_ms, 0) or 0.0,
    )


def parse_plan(raw: Any) -> Plan:
    """A plan from a request body (PoolConfigError naming what is wrong):

        {"canary": "v2", "stable": "v1",           # "stable": default the one other pool
         "steps": [1, 5, 25, 50, 100],             # canary's % of new sessions; ends at 100
         "hold_s": 60,                             # per step (a number, or one per step)
         "analysis": {"min_samples": 20,           # canary outcomes before any verdict
                      "window_s": 60,              # sliding window judged (default hold_s)
                      "max_error_rate_increase": 0.02,   # canary's rate - stable's
                      "max_ttft_p99_ratio": 1.5,   # canary p99 TTFT / stable's
                      "max_itl_p99_ratio": 1.5,    # canary p99 inter-token / stable's
                      "latency_slack_ms": 20}}     # and at least this much worse

    A bound set to null is off.
    """
    if not isinstance(raw, dict):
        raise PoolConfigError("a rollout plan must be an object")
    unknown = set(raw) - {"canary", "stable", "steps", "hold_s", "analysis"}
    if unknown:
        raise PoolConfigError(f"unknown rollout keys: {sorted(unknown)}")
    canary, stable = raw.get("canary"), raw.get("stable", "")
    if not isinstance(canary, str) or not canary:
        raise PoolConfigError("canary must name a pool")
    if not isinstance(stable, str):
        raise PoolConfigError("stable must name a pool")
    if stable == canary:
        raise PoolConfigError("canary and stable must be different pools")
    steps = raw.get("steps", [1, 5, 25, 50, 100])
    if not isinstance(steps, list) or not 1 <= len(steps) <= MAX_STEPS:
        raise PoolConfigError(f"steps must be a list of 1 to {MAX_STEPS} percentages")
    given = [number({"steps": s}, "steps", None, 0, 100) for s in steps]
    if any(s is None for s in given):
        raise PoolConfigError("steps must be numbers")
    steps = [float(s) for s in given]
    if any(b <= a for a, b in itertools.pairwise(steps)) or steps[0] <= 0:
        raise PoolConfigError("steps must rise strictly, each above 0")
    if steps[-1] != 100:
        raise PoolConfigError("the last step must be 100 (the canary takes all new sessions)")
    hold = raw.get("hold_s", 60.0)
    holds = hold if isinstance(hold, list) else [hold] * len(steps)
    if len(holds) != len(steps):
        raise PoolConfigError("hold_s must be a number or one number per step")
    hold_s = [float(number({"hold_s": h}, "hold_s", None, 0, 86400) or 0.0) for h in holds]
    return Plan(canary, stable, steps, hold_s, parse_analysis(raw.get("analysis")))


def judge(a: Analysis, canary: WindowStats, stable: WindowStats | None) -> str | None:
    """Why the canary fails its bounds now, or None (also while samples are too few).

    `stable`: the baseline (None: none known yet; then only the error bound applies, with
    a baseline of 0)."""
    if canary.requests < a.min_samples:
        return None
    if a.max_error_rate_increase is not None:
        base = stable.error_rate if stable is not None else 0.0
        if canary.error_rate - base > a.max_error_rate_increase:
            return (
                f"error rate {canary.error_rate:.1%} over {canary.requests} requests vs "
                f"stable {base:.1%}: more than {a.max_error_rate_increase:.1%} above"
            )
    if stable is None:
        return None
    slack = a.latency_slack_ms / 1000
    for what, mine, theirs, ratio in (
        ("p99 TTFT", canary.ttft_p99_s, stable.ttft_p99_s, a.max_ttft_p99_ratio),
        ("p99 inter-token", canary.itl_p99_s, stable.itl_p99_s, a.max_itl_p99_ratio),
    ):
        if ratio is None or mine is None or theirs is None:
            continue
        if mine > theirs * ratio and mine - theirs > slack:
            return (
                f"{what} {mine * 1000:.1f} ms vs stable {theirs * 1000:.1f} ms: "
                f"over {ratio:g}x and {a.latency_slack_ms:g} ms worse"
            )
    return None
