"""Worker metrics: lock-free figures, exported under the documented names."""

from __future__ import annotations

from prometheus_client import generate_latest

from model_service.obs.metrics import Rate, WorkerMetrics
from model_service.types import EngineStats, WorkerFigures
from sluice_common.histogram import Histogram


def samples(m: WorkerMetrics) -> dict[str, float]:
    out = {}
    for line in generate_latest(m.registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_histogram_buckets_are_upper_bound_inclusive_and_cumulative() -> None:
    h = Histogram((0.1, 1.0))
    for v in (0.1, 0.5, 1.0, 3.0):
        h.observe(v)
    buckets, total = h.cumulative()
    assert buckets == [(0.1, 1), (1.0, 3), (float("inf"), 4)] and total == 4.6


def test_names_and_values_of_a_scrape() -> None:
    m = WorkerMetrics()
    m.ended("OK", 10, 3, (0.001, 0.02, 0.3))
    m.ended("CANCELLED", 5, 0, (0.002, 0.0, 0.1))
    m.refused("INVALID_ARGUMENT")
    for gap in (0.004, 0.006):
        m.itl.observe(gap)
    stats = EngineStats(running=2, waiting=1, max_running=4, kv_cache_usage=0.5)
    m.watch(lambda: WorkerFigures(True, False, stats, 3, 4, 5, 1234, 7, 2, 1, 9))
    s = samples(m)
    p = "sluice_worker_"
    assert s[p + 'requests_total{code="OK"}'] == 1
    assert s[p + 'requests_total{code="CANCELLED"}'] == 1
    assert s[p + 'requests_total{code="INVALID_ARGUMENT"}'] == 1
    assert s[p + "prompt_tokens_total"] == 15 and s[p + "generation_tokens_total"] == 3
    assert s[p + "time_to_first_token_seconds_count"] == 1  # only generations with tokens
    assert s[p + "request_duration_seconds_count"] == 2
    assert s[p + 'inter_token_latency_seconds_bucket{le="0.005"}'] == 1
    assert s[p + 'inter_token_latency_seconds_bucket{le="+Inf"}'] == 2
    assert s[p + "inter_token_latency_seconds_count"] == 2
    assert abs(s[p + "inter_token_latency_seconds_sum"] - 0.01) < 1e-12
    assert s[p + "running_requests"] == 2 and s[p + "kv_cache_usage_ratio"] == 0.5
    assert s[p + "in_flight_requests"] == 3 and s[p + "replay_bytes"] == 1234
    assert s[p + "ready"] == 1 and s[p + "draining"] == 0
    assert s[p + "admission_rejections_total"] == 7 and s[p + "wasted_tokens_total"] == 9
    assert s[p + "queued_requests"] == 4 and s[p + "displaced_total"] == 5


def test_before_the_engine_is_ready_load_gauges_read_zero() -> None:
    m = WorkerMetrics()
    m.watch(lambda: WorkerFigures(False, False, None, 0, 0, 0, 0, 0, 0, 0, 0))
    s = samples(m)
    assert s["sluice_worker_ready"] == 0 and s["sluice_worker_running_requests"] == 0


def test_the_autoscaling_signals_queue_depth_and_tokens_per_second() -> None:
    m = WorkerMetrics()
    now = [100.0]
    m.tokens_per_s = Rate(10.0, clock=lambda: now[0])
    stats = EngineStats(running=2, waiting=3, max_running=4, kv_cache_usage=0.25)
    m.watch(lambda: WorkerFigures(True, False, stats, 9, 4, 0, 0, 0, 0, 0, 0))
    p = "sluice_worker_"
    assert samples(m)[p + "generation_tokens_per_second"] == 0  # one scrape: no rate yet
    for _ in range(4):
        now[0] += 5.0
        m.ended("OK", 1, 100, (0.0, 0.0, 0.0))
    s = samples(m)  # 400 tokens in 20 s; the window keeps the samples of the last 10 s+
    assert s[p + "queue_depth"] == 7  # the worker's queue (4) and the engine's (3)
    assert s[p + "generation_tokens_per_second"] == 20.0
    now[0] += 5.0
    m.ended("OK", 1, 50, (0.0, 0.0, 0.0))
    assert samples(m)[p + "generation_tokens_per_second"] == 18.0  # (50 + 400) / 25 s
    for _ in range(3):
        now[0] += 5.0
        samples(m)
    assert samples(m)[p + "generation_tokens_per_second"] == 0  # nothing in the last 15 s
