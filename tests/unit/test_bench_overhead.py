"""Overhead mode's figures (scripts/bench/overhead.py) from hand-made run summaries: the
edge against its peers (vllm-router, SMG) per event, each hop's added latency, and which
processes a target is charged for; and their rows in the markdown; one summary's window
from hand-made records. No servers, so no peers either."""

from __future__ import annotations

from typing import Any

from scripts.bench import report
from scripts.bench.load import LoadResult
from scripts.bench.overhead import overhead_analysis
from scripts.bench.record import RequestRecord
from scripts.bench.stats import summarize

EVENTS = 10_000


def run(label: str, w2c_ms: tuple[float, float], cpu_s: dict[str, float]) -> dict[str, Any]:
    """A run summary with what overhead_analysis reads: 100 requests x 100 events."""
    return {
        "label": label,
        "requests": {"completed": 100, "ok": 100, "errors": 0, "cancelled": 0},
        "tokens_total": EVENTS,
        "events_total": EVENTS,
        "tokens_per_s": 1000.0,
        "steady_tokens_per_s": 1000.0,
        "requests_per_s": 10.0,
        "tokens_per_event": 1.0,
        "ttft_ms": {"p50": 5.0},
        "itl_ms": {"p50": 20.5, "p99": 25.0},
        "stamp_latency_ms": {"p50": w2c_ms[0], "p99": w2c_ms[1]},
        "wire": {"rx_bytes_per_token": 400.0, "payload_bytes_per_token": 390.0},
        "processes": {
            name: {"cpu_s": s, "cpu_pct": s * 10, "rss_start_mib": 50.0, "rss_peak_mib": 51.0}
            for name, s in cpu_s.items()
        },
    }


def rounds(
    edge_s: tuple[float, float],
    router_s: tuple[float, float],
    smg_s: tuple[float, float] | None = None,
) -> list[dict[str, Any]]:
    """Two alternating rounds of grpc, sse, router (and smg with `smg_s`); every process
    watched in every run."""
    out = []
    for r in range(2):
        idle = {"sim-worker": 1.0, "edge": 0.01, "vllm-router": 0.0}
        if smg_s:
            idle["smg"] = 0.002
        behind_router = {**idle, "edge": edge_s[r], "vllm-router": router_s[r]}
        out += [
            run(f"grpc #{r + 1}", (0.5, 2.0), idle),
            run(f"sse #{r + 1}", (1.5, 6.0), {**idle, "edge": edge_s[r]}),
            run(f"router #{r + 1}", (2.0, 9.0), behind_router),
        ]
        if smg_s:
            behind_smg = {**idle, "edge": edge_s[r], "smg": smg_s[r]}
            out.append(run(f"smg #{r + 1}", (1.75, 7.0), behind_smg))
    return out


TARGETS = ("grpc", "sse", "router")
ALL = ("grpc", "sse", "router", "smg")


def test_edge_over_router_is_the_median_of_round_by_round_ratios():
    # Round 1: edge 100 us/event, router 50 (2.0x); round 2: 120 vs 30 (4.0x).
    o = overhead_analysis(rounds((1.0, 1.2), (0.5, 0.3)), TARGETS, 64, 0.02)
    assert o["edge.cpu_us_per_event"] == 110.0  # median of 100 and 120
    assert o["vllm-router.cpu_us_per_event"] == 40.0
    assert o["edge_over_router_cpu_per_event"] == 3.0  # median of 2.0 and 4.0, not 110/40
    assert o["edge.cpu_us_per_request"] == 11_000.0
    assert o["goal edge_over_router_cpu_per_event <= 1.0"] == "not met"


def test_edge_cheaper_than_the_router_meets_the_goal():
    o = overhead_analysis(rounds((0.3, 0.3), (0.5, 0.4)), TARGETS, 64, 0.02)
    assert o["edge_over_router_cpu_per_event"] < 1
    assert o["goal edge_over_router_cpu_per_event <= 1.0"] == "met"


def test_added_latency_per_hop():
    o = overhead_analysis(rounds((1.0, 1.0), (0.5, 0.5)), TARGETS, 64, 0.02)
    assert (o["edge_added_p50_ms"], o["edge_added_p99_ms"]) == (1.0, 4.0)
    assert (o["router_added_p50_ms"], o["router_added_p99_ms"]) == (0.5, 3.0)
    assert (o["router_edge_added_p50_ms"], o["router_edge_added_p99_ms"]) == (1.5, 7.0)
    assert o["router.lateness_p50_ms"] == 0.5


def test_a_target_is_charged_only_for_the_processes_on_its_path():
    # The idle edge during gRPC runs and the idle router during SSE runs are not costs of
    # those targets.
    cpu = overhead_analysis(rounds((1.0, 1.0), (0.5, 0.5)), TARGETS, 64)["cpu"]
    assert list(cpu["grpc"]) == ["sim-worker"]
    assert list(cpu["sse"]) == ["sim-worker", "edge"]
    assert list(cpu["router"]) == ["sim-worker", "edge", "vllm-router"]
    router = cpu["router"]["vllm-router"]
    assert router["cpu_us_per_event"] == 50.0 and router["cpu_us_per_request"] == 5000.0
    assert router["requests_per_s_per_core"] == 200.0  # 100 requests per 0.5 CPU-s


def test_per_request_goals_only_for_one_token_streams():
    runs = rounds((0.02, 0.02), (0.01, 0.01))
    many = overhead_analysis(runs, TARGETS, 64)
    assert not [k for k in many if k.endswith("cpu_us_per_request <= 250")]
    one = overhead_analysis(runs, TARGETS, 64, one_token=True)
    assert one["goal sse.edge.cpu_us_per_request <= 250"] == "met"  # 200 us
    assert one["goal grpc.sim-worker.cpu_us_per_request <= 250"] == "not met"  # 10 ms


def test_without_the_router_there_is_no_peer_figure():
    runs = [r for r in rounds((1.0, 1.0), (0.5, 0.5)) if not r["label"].startswith("router")]
    o = overhead_analysis(runs, ("grpc", "sse"), 64)
    assert "edge_over_router_cpu_per_event" not in o and "router_added_p50_ms" not in o
    assert o["edge_added_p50_ms"] == 1.0 and "router" not in o["cpu"]


def test_edge_over_smg_beside_edge_over_router():
    # Edge 100 and 120 us/event; router 50 and 30 (2.0x, 4.0x); SMG 40 and 80 (2.5x, 1.5x).
    o = overhead_analysis(rounds((1.0, 1.2), (0.5, 0.3), (0.4, 0.8)), ALL, 64, 0.02)
    assert o["edge_over_router_cpu_per_event"] == 3.0
    assert o["smg.cpu_us_per_event"] == 60.0  # median of 40 and 80
    assert o["smg.cpu_us_per_request"] == 6000.0
    assert o["edge_over_smg_cpu_per_event"] == 2.0  # median of 2.5 and 1.5, not 110/60
    assert o["edge_over_smg_cpu_per_request"] == 2.0
    assert o["goal edge_over_smg_cpu_per_event <= 1.0"] == "not met"
    assert o["goal edge_over_router_cpu_per_event <= 1.0"] == "not met"


def test_smg_is_charged_for_its_own_path_only():
    cpu = overhead_analysis(rounds((1.0, 1.0), (0.5, 0.5), (0.4, 0.4)), ALL, 64)["cpu"]
    assert {t: list(p) for t, p in cpu.items()} == {
        "grpc": ["sim-worker"],
        "sse": ["sim-worker", "edge"],
        "router": ["sim-worker", "edge", "vllm-router"],
        "smg": ["sim-worker", "edge", "smg"],
    }
    assert cpu["smg"]["smg"]["requests_per_s_per_core"] == 250.0  # 100 requests / 0.4 CPU-s


def test_smg_added_latency():
    o = overhead_analysis(rounds((1.0, 1.0), (0.5, 0.5), (0.4, 0.4)), ALL, 64, 0.02)
    assert (o["smg_added_p50_ms"], o["smg_added_p99_ms"]) == (0.25, 1.0)  # smg - sse
    assert (o["smg_edge_added_p50_ms"], o["smg_edge_added_p99_ms"]) == (1.25, 5.0)  # - grpc
    assert (o["router_added_p50_ms"], o["router_added_p99_ms"]) == (0.5, 3.0)


def test_smg_alone_without_the_router():
    runs = [r for r in rounds((0.3, 0.3), (0.5, 0.5), (0.4, 0.4)) if "router" not in r["label"]]
    o = overhead_analysis(runs, ("sse", "smg"), 64)
    assert o["goal edge_over_smg_cpu_per_event <= 1.0"] == "met"  # 30 vs 40 us
    assert o["edge.cpu_us_per_event"] == 30.0
    assert not [k for k in o if "router" in k] and "router" not in o["cpu"]


def test_the_markdown_carries_both_peers():
    runs = rounds((1.0, 1.2), (0.5, 0.3), (0.4, 0.8))
    meta = {"command": "x", "time_utc": "t", "commit": "c",
            "machine": {"cores": 2, "cpu": "", "mem_gib": 1.0}}  # fmt: skip
    doc = {"meta": meta, "mode": "overhead", "runs": [], "processes": {},
           "overhead": overhead_analysis(runs, ALL, 64, 0.02)}  # fmt: skip
    lines = report.markdown(doc).splitlines()
    assert "| edge_over_router_cpu_per_event | 3 |" in lines
    assert "| edge_over_smg_cpu_per_event | 2 |" in lines
    assert "| smg.cpu_us_per_event | 60 |" in lines
    assert "| goal edge_over_smg_cpu_per_event <= 1.0 | not met |" in lines
    # CPU table: rounds of 4,000 and 8,000 us a request; per core from their median
    # (1e6 / 6,000), not the median of 250 and 125 (187.5, which disagreed with the row).
    assert "| smg | smg | 6 | 60 | 6,000 | 166.7 |" in lines


def test_a_peer_without_stamps_gets_a_note_not_a_difference():
    # SMG does not forward X-Sluice-Stamp-Times, so its runs carry no stamps at all.
    runs = rounds((1.0, 1.0), (0.5, 0.5), (0.4, 0.4))
    for r in runs:
        if r["label"].startswith("smg"):
            r["stamp_latency_ms"] = {"n": 0}
    o = overhead_analysis(runs, ALL, 64, 0.02)
    assert o["smg_added_p50_ms"] is None and o["smg_edge_added_p99_ms"] is None
    assert o["note smg"] == "no worker stamps through this peer; compare its lateness_*"
    assert o["smg.lateness_p50_ms"] == 0.5 and "note router" not in o


def test_worker_to_client_all_open_counts_only_events_while_every_stream_is_open():
    """The window runs from the last stream's first token to the first stream's end: the
    ramp's and the drain's events stay out of it."""
    ms = 1_000_000

    def stream(first: int, end: int, at_lat: list[tuple[int, int]]) -> RequestRecord:
        rec = RequestRecord(target="sse", start_ns=0, first_ns=first * ms, end_ns=end * ms)
        rec.event_ns = [at * ms for at, _ in at_lat]
        rec.stamp_at_ns = [at * ms for at, _ in at_lat]
        rec.stamp_lat_ns = [lat * ms for _, lat in at_lat]
        rec.tokens = len(at_lat)
        return rec

    early = stream(10, 100, [(10, 900), (50, 2), (99, 3), (100, 4)])
    late = stream(40, 120, [(40, 700), (60, 5), (110, 800)])
    run = summarize(LoadResult("sse", [early, late], start_ns=0, end_ns=120 * ms))
    held = run["stamp_latency_all_open_ms"]
    assert (held["n"], held["min"], held["max"]) == (5, 2.0, 700.0)  # 40 <= at <= 100
    assert run["stamp_latency_ms"]["n"] == 7
    # A failed request's end closes the window too; one that never ran leaves it.
    failed = RequestRecord(target="sse", start_ns=0, end_ns=80 * ms, error="http_500")
    never = RequestRecord(target="sse", error="connect")
    run = summarize(LoadResult("sse", [early, late, failed, never], start_ns=0, end_ns=120 * ms))
    held = run["stamp_latency_all_open_ms"]
    assert (held["n"], held["min"], held["max"]) == (3, 2.0, 700.0)  # 40 <= at <= 80
