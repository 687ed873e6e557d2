"""The routing bench's targets: `kv_aware@N` (a load slack) parsed and analysed beside the rest."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from scripts.bench.config import ROUTING_TARGETS, names_of
from scripts.bench.routing import analysis


def _run(label: str, hit: float, ttft: float) -> dict[str, Any]:
    return {
        "label": label,
        "prefix_cache": {"hit_rate": hit},
        "ttft_ms": {"p50": ttft, "p99": 2 * ttft},
        "e2e_ms": {"p50": 10 * ttft},
        "requests_per_s": 40.0,
        "requests": {"errors": 0},
    }


def test_a_slack_target_is_parsed_and_weighed_against_random() -> None:
    parse = names_of(ROUTING_TARGETS)
    assert parse("kv_aware@16,random") == ("kv_aware@16", "random")
    with pytest.raises(argparse.ArgumentTypeError):
        parse("nothing@16")
    runs = [_run("kv_aware@16 #1", 0.3, 60.0), _run("random #1", 0.2, 100.0)]
    shares = {r["label"]: {"max_over_mean": 1.2} for r in runs}
    out = analysis(runs, shares, ("kv_aware@16", "random"))
    assert {k: v for k, v in out.items() if k.startswith("kv_aware@16_over")} == {
        "kv_aware@16_over_random.hit_rate": 1.5,
        "kv_aware@16_over_random.ttft_p50": 0.6,
    }
    assert out["goal kv_aware@16 hit_rate >= 1.5x random"] == "met"
    assert out["goal kv_aware@16 ttft_p50 <= 0.7x random"] == "met"


def test_the_help_lists_every_default_as_typed() -> None:
    from scripts.bench.config import build_parser

    text = " ".join(build_parser().format_help().split())  # it raised on integer lists
    assert "decision mode: chars (default: 1000,8000,32000,128000)" in text
