"""Percentiles and the summary of one run (plain Python: no numpy needed).

Throughput has two forms: `tokens_per_s` = all completion tokens of successful requests
over the whole run (first send to last byte, drain tail included, as vLLM's own benchmark
counts), and `steady_tokens_per_s` = tokens that arrived while requests were still being
issued, over that window (no ramp-down tail). Latencies are in milliseconds.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Any

from scripts.bench.load import LoadResult
from scripts.bench.record import RequestRecord

PERCENTILES = (50, 90, 99)


def percentile(sorted_values: list[float], p: float) -> float:
    """Linear-interpolated percentile of already sorted values (numpy's default method)."""
    if not sorted_values:
        return math.nan
    k = (len(sorted_values) - 1) * p / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def median(values: list[Any]) -> float | None:
    """Median of the values that are numbers (None and NaN left out), 4 decimals."""
    vals = [v for v in values if v is not None and v == v]
    return round(statistics.median(vals), 4) if vals else None


def distribution(values_ns: list[int], scale: float = 1e-6) -> dict[str, float | int]:
    """n, mean, min, p50, p90, p99, max of nanosecond values, in ms by default."""
    if not values_ns:
        return {"n": 0}
    vals = sorted(values_ns)
    out: dict[str, float | int] = {"n": len(vals), "mean": sum(vals) / len(vals) * scale}
    out["min"] = vals[0] * scale
    for p in PERCENTILES:
        out[f"p{p}"] = percentile(vals, p) * scale  # type: ignore[arg-type]
    out["max"] = vals[-1] * scale
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


def _tokens_per_event(rec: RequestRecord) -> float:
    return rec.tokens / len(rec.event_ns) if rec.event_ns else 0.0


def series(result: LoadResult, ok: list[RequestRecord], bucket_s: float = 1.0) -> list[dict]:
    """Tokens/s and completed requests per time bucket since the start."""
    width = int(bucket_s * 1e9)
    n = max(1, math.ceil((result.end_ns - result.start_ns) / width))
    tokens = [0.0] * n
    done = [0] * n
    for rec in ok:
        per = _tokens_per_event(rec)
        for t in rec.event_ns:
            tokens[min(n - 1, max(0, (t - result.start_ns) // width))] += per
        done[min(n - 1, max(0, (rec.end_ns - result.start_ns) // width))] += 1
    span = max(1, result.end_ns - result.start_ns)
    out = []
    for i in range(n):
        w = min(width, span - i * width) / 1e9  # the last bucket may be partial
        out.append({"t": round(i * bucket_s, 3), "width_s": round(w, 3),
                    "tokens_per_s": round(tokens[i] / w, 1), "done": done[i]})  # fmt: skip
    return out


def summarize(result: LoadResult) -> dict[str, Any]:
    """Everything a report shows about one run."""
    recs = result.records
    ok = [r for r in recs if r.ok]
    duration = max(1e-9, (result.end_ns - result.start_ns) / 1e9)
    window_ns = max(1, (result.stop_ns or result.end_ns) - result.start_ns)
    tokens = sum(r.tokens for r in ok)
    events = sum(len(r.event_ns) for r in ok)
    steady = sum(
        _tokens_per_event(r) * sum(1 for t in r.event_ns if t <= result.start_ns + window_ns)
        for r in ok
    )
    itl: list[int] = []
    stamps: list[int] = []
    for r in ok:
        itl.extend(r.itl_ns())
        stamps.extend(r.stamp_lat_ns)
    # Every stream open at once: from the last first token to the first end of any
    # request (a failed one's too); a request that got no token event has no first token.
    opened = max((r.first_ns for r in ok), default=0)
    ending = min((r.end_ns for r in recs if r.end_ns), default=0)
    held = [
        lat
        for r in ok
        for at, lat in zip(r.stamp_at_ns, r.stamp_lat_ns, strict=True)
        if opened <= at <= ending
    ]
    errors = Counter(r.error for r in recs if r.error)
    samples: dict[str, str] = {}
    for r in recs:
        if r.error and r.error not in samples:
            samples[r.error] = r.error_detail
    rx = sum(r.rx_bytes for r in ok)
    payload = sum(r.rx_payload_bytes for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    by_worker = Counter(r.worker for r in ok if r.worker)
    return {
        "label": result.label,
        "requests": {
            "completed": len(recs),
            "ok": len(ok),
            "errors": len(recs) - len(ok),
            "cancelled": result.cancelled,
        },
        "errors_by_kind": dict(errors),
        "error_samples": samples,
        "duration_s": round(duration, 3),
        "tokens_total": tokens,
        "tokens_per_s": round(tokens / duration, 1),
        "steady_tokens_per_s": round(steady / (window_ns / 1e9), 1),
        "requests_per_s": round(len(ok) / duration, 3),
        "events_total": events,
        "tokens_per_event": round(tokens / events, 3) if events else 0,
        "usage_reported": round(sum(r.usage_tokens for r in ok) / len(ok), 3) if ok else 0,
        "ttft_ms": distribution([r.first_ns - r.start_ns for r in ok if r.first_ns]),
        "itl_ms": distribution(itl),
        "e2e_ms": distribution([r.e2e_ns for r in ok]),
        "stamp_latency_ms": distribution(stamps),
        "stamp_latency_all_open_ms": distribution(held),
        "tokens_per_request": distribution([r.tokens for r in ok], scale=1.0),
        "prefix_cache": {
            "prompt_tokens": prompt_tokens,
            "cached_tokens": cached,
            "hit_rate": round(cached / prompt_tokens, 4) if prompt_tokens else None,
        },
        "served_by": dict(sorted(by_worker.items())),
        "wire": {
            "rx_bytes": rx,
            "rx_bytes_per_token": round(rx / tokens, 2) if tokens else 0,
            "payload_bytes_per_token": round(payload / tokens, 2) if tokens else 0,
            "rx_bytes_per_event": round(rx / events, 2) if events else 0,
        },
        "harness": {
            "procs": result.procs,
            "cpu_s": round(result.cpu_s, 3),
            "cpu_pct": round(100 * result.cpu_s / duration, 1),
        },
        "processes": result.processes,
        "series": series(result, ok),
    }
