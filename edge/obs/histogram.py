"""A Prometheus histogram, hand-written for the edge's per-event hot path.

`observe` is one `bisect` and two additions (~0.2 µs; prometheus_client's takes a lock
and costs several times that), and the edge keeps prometheus_client out of its
dependencies (it comes with vLLM, which the edge never installs). Per process: with
`--processes N` each uvicorn process has its own histograms, and a scrape sees the one
process that answered (run one process per pod and scale pods).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

# Seconds. Client-visible latencies (time to first token), gaps between events, and the
# edge's own overhead per event (gRPC receive -> SSE write), which is sub-millisecond.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
OVERHEAD_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1,
)  # fmt: skip


class Histogram:
    """Counts per bucket (upper bounds inclusive, as Prometheus' `le`), sum and count."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float, weight: int = 1) -> None:
        """Count `value` (`weight` times: e.g. one mean gap for several merged tokens)."""
        self.counts[bisect_left(self.bounds, value)] += weight
        self.sum += value * weight

    @property
    def count(self) -> int:
        return sum(self.counts)

    def samples(self, name: str, labels: str = "") -> list[str]:
        """Exposition lines: cumulative `_bucket`s, `_sum`, `_count`. `labels`: `a="b",...`."""
        sep = "," if labels else ""
        out = []
        total = 0
        les = [repr(float(b)) for b in self.bounds] + ["+Inf"]
        for le, n in zip(les, self.counts, strict=True):
            total += n
            out.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {total}')
        tail = f"{{{labels}}}" if labels else ""
        out.append(f"{name}_sum{tail} {self.sum!r}")
        out.append(f"{name}_count{tail} {total}")
        return out
