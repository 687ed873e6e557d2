"""Compare mode's figures: A/B ratios per round (medians), each side's medians, the goals,
and the CPU per token of the processes each named stack is made of.

A stack's processes (`STACKS`, the names compare mode starts them under) are watched in
every run, the other side's too; a side is charged only for its own. `front_*` is the
process in front of the engine (our edge, SMG's gRPC router), the one the gRPC-first peer
is measured against: `front_cpu_per_token_ratio` = A's front over B's, round by round.
"""

from __future__ import annotations

from typing import Any

from scripts.bench.stats import median

GOALS = {"tokens_per_s_ratio": (">=", 1.0), "ttft_p50_ratio": ("<=", 1.1)}
# Compare target -> the processes it is made of, the front one first where it has one.
STACKS = {
    "sluice": ("edge", "vllm-worker"),
    "sluice-grpc": ("vllm-worker",),
    "vllm": ("vllm-server",),
    "smg-grpc": ("smg-grpc", "vllm-grpc-server"),
}
FRONTS = {"sluice": "edge", "smg-grpc": "smg-grpc"}
METRICS = {
    "tokens_per_s": lambda r: r["tokens_per_s"],
    "ttft_p50": lambda r: r["ttft_ms"].get("p50"),
    "ttft_p99": lambda r: r["ttft_ms"].get("p99"),
    "itl_p50": lambda r: r["itl_ms"].get("p50"),
    "e2e_p50": lambda r: r["e2e_ms"].get("p50"),
}


def cpu_us_per_token(run: dict[str, Any], name: str) -> float | None:
    """One run's CPU of one watched process per token the harness received."""
    p = (run.get("processes") or {}).get(name)
    if p is None or not run["tokens_total"]:
        return None
    return round(p["cpu_s"] * 1e6 / run["tokens_total"], 2)


def _side(runs: list[dict[str, Any]], spec: str) -> list[dict[str, Any]]:
    return [r for r in runs if r["label"].rsplit(" #", 1)[0] == spec]


def _ratios(va: list[Any], vb: list[Any]) -> float | None:
    return median([x / y for x, y in zip(va, vb, strict=False) if x is not None and y])


def _cpu(out: dict[str, Any], ra: list[dict[str, Any]], rb: list[dict[str, Any]]) -> None:
    a, b = out["A"], out["B"]
    for side, spec, rs in (("A", a, ra), ("B", b, rb)):
        for name in STACKS.get(spec, ()):
            out[f"{side}.{name}.cpu_us_per_token"] = median([cpu_us_per_token(r, name) for r in rs])
    if a in FRONTS and b in FRONTS:
        va = [cpu_us_per_token(r, FRONTS[a]) for r in ra]
        vb = [cpu_us_per_token(r, FRONTS[b]) for r in rb]
        out["front_cpu_per_token_ratio"] = _ratios(va, vb)


def comparison(runs: list[dict[str, Any]], a: str, b: str) -> dict[str, Any]:
    """A/B ratios per round (medians), A's and B's medians, the goals met or not, and
    each side's CPU per token of its own processes."""
    ra, rb = _side(runs, a), _side(runs, b)
    out: dict[str, Any] = {"A": a, "B": b, "rounds": min(len(ra), len(rb))}
    for name, get in METRICS.items():
        va, vb = [get(r) for r in ra], [get(r) for r in rb]
        out[f"A.{name}"], out[f"B.{name}"] = median(va), median(vb)
        out[f"{name}_ratio"] = _ratios(va, vb)
    for name, (op, goal) in GOALS.items():
        value = out.get(name)
        if value is not None:
            out[f"goal {name} {op} {goal}"] = (
                "met" if (value >= goal if op == ">=" else value <= goal) else "not met"
            )
    _cpu(out, ra, rb)
    return out
