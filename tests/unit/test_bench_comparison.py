"""Compare mode's figures (scripts/bench/comparison.py) from hand-made run summaries: the
A/B ratios round by round, and each stack charged the CPU of its own processes only (our
edge against SMG's gRPC router in front of vLLM's gRPC server)."""

from __future__ import annotations

from typing import Any

from scripts.bench.comparison import comparison

TOKENS = 10_000
# Every process of both stacks is watched in every run (both stacks run at once).
IDLE = {"edge": 0.01, "vllm-worker": 0.02, "smg-grpc": 0.01, "vllm-grpc-server": 0.02}


def run(label: str, tokens_per_s: float, ttft: float, cpu_s: dict[str, float]) -> dict[str, Any]:
    return {
        "label": label,
        "tokens_total": TOKENS,
        "tokens_per_s": tokens_per_s,
        "ttft_ms": {"p50": ttft, "p99": ttft * 2},
        "itl_ms": {"p50": 20.0},
        "e2e_ms": {"p50": 500.0},
        "processes": {name: {"cpu_s": s} for name, s in {**IDLE, **cpu_s}.items()},
    }


def rounds() -> list[dict[str, Any]]:
    """Two rounds of sluice then smg-grpc: edge 100 then 60 us/token, SMG's router 50 then
    60 (2.0x, 1.0x); tokens/s 110 vs 100, then 90 vs 100."""
    return [
        run("sluice #1", 110.0, 200.0, {"edge": 1.0, "vllm-worker": 20.0}),
        run("smg-grpc #1", 100.0, 250.0, {"smg-grpc": 0.5, "vllm-grpc-server": 22.0}),
        run("sluice #2", 90.0, 240.0, {"edge": 0.6, "vllm-worker": 18.0}),
        run("smg-grpc #2", 100.0, 200.0, {"smg-grpc": 0.6, "vllm-grpc-server": 24.0}),
    ]


def test_sluice_against_smg_grpc():
    assert comparison(rounds(), "sluice", "smg-grpc") == {
        "A": "sluice",
        "B": "smg-grpc",
        "rounds": 2,
        "A.tokens_per_s": 100.0,
        "B.tokens_per_s": 100.0,
        "tokens_per_s_ratio": 1.0,  # median of 1.1 and 0.9
        "A.ttft_p50": 220.0,
        "B.ttft_p50": 225.0,
        "ttft_p50_ratio": 1.0,  # median of 0.8 and 1.2
        "A.ttft_p99": 440.0,
        "B.ttft_p99": 450.0,
        "ttft_p99_ratio": 1.0,
        "A.itl_p50": 20.0,
        "B.itl_p50": 20.0,
        "itl_p50_ratio": 1.0,
        "A.e2e_p50": 500.0,
        "B.e2e_p50": 500.0,
        "e2e_p50_ratio": 1.0,
        "goal tokens_per_s_ratio >= 1.0": "met",
        "goal ttft_p50_ratio <= 1.1": "met",
        # Each side's own processes only: the other stack's idle ones are not its cost.
        "A.edge.cpu_us_per_token": 80.0,
        "A.vllm-worker.cpu_us_per_token": 1900.0,
        "B.smg-grpc.cpu_us_per_token": 55.0,
        "B.vllm-grpc-server.cpu_us_per_token": 2300.0,
        "front_cpu_per_token_ratio": 1.5,  # median of 2.0 and 1.0, not 80 / 55
    }


def test_a_stack_without_a_front_or_processes_gets_no_cpu_ratio():
    runs = [{**r, "label": r["label"].replace("smg-grpc", "sse:http://x")} for r in rounds()]
    out = comparison(runs, "sluice", "sse:http://x")
    assert "front_cpu_per_token_ratio" not in out
    assert [k for k in out if k.endswith("cpu_us_per_token")] == [
        "A.edge.cpu_us_per_token",
        "A.vllm-worker.cpu_us_per_token",
    ]
