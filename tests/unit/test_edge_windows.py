"""The fleet's canary windows, pure parts: outcomes as per-second bucket fields, and the
window the buckets make together (counts exact, percentiles within a bin's half width)."""

from __future__ import annotations

import random

import pytest

from edge.obs.outcomes import PoolMetrics
from edge.release.windows import BIN_FACTOR, bin_percentile, bin_value, counts, latency_bin, stats


@pytest.mark.parametrize("seconds", [1e-5, 1e-4, 0.0021, 0.05, 0.3, 1.0, 7.5, 120.0])
def test_a_latency_is_read_back_within_half_a_bin(seconds):
    value = bin_value(latency_bin(seconds))
    if seconds >= 1e-4:
        assert abs(value / seconds - 1) <= BIN_FACTOR**0.5 - 1 + 1e-9
    else:  # below the lowest bin: counted in bin 0
        assert latency_bin(seconds) == 0


def test_buckets_summed_make_the_window_one_process_would_have_seen():
    rng = random.Random(7)
    whole = PoolMetrics()
    per_process: list[list] = [[], [], []]
    for i in range(600):
        t = 1000.0 + i * 0.05  # 30 s of outcomes
        error = rng.random() < 0.1
        ttft, itl = rng.uniform(0.01, 0.5), rng.uniform(0.001, 0.02)
        whole.outcome("upstream_error" if error else "ok", ttft, now=t, itl_s=itl)
        per_process[i % 3].append((t, error, ttft, itl))
    offset = 1.7e9  # wall clock minus monotonic
    buckets: dict[int, dict[str, int]] = {}
    for entries in per_process:
        for b, fields in counts(entries, offset).items():
            mine = buckets.setdefault(b, {})
            for k, v in fields.items():
                mine[k] = mine.get(k, 0) + v
    assert len(buckets) == 30
    got = stats(list(buckets.values()))
    exact = whole.window(60, now=1030.0)
    assert (got.requests, got.errors) == (exact.requests, exact.errors) == (600, exact.errors)
    assert exact.errors > 0
    for mine, theirs in (
        (got.ttft_p50_s, exact.ttft_p50_s),
        (got.ttft_p99_s, exact.ttft_p99_s),
        (got.itl_p99_s, exact.itl_p99_s),
    ):
        assert mine is not None and theirs is not None
        assert abs(mine / theirs - 1) <= BIN_FACTOR - 1


def test_an_empty_window_has_no_percentiles():
    assert stats([]).requests == 0 and stats([{}]).ttft_p99_s is None
    assert bin_percentile({}, 0.99) is None  # type: ignore[arg-type]
