"""A histogram for the hot path: no lock, rendered at scrape time.

`observe` is one `bisect` and two additions (~0.2 µs); prometheus_client's takes a lock
for every observation. Updates happen on the event loop's thread only; a scrape from
another thread copies the counts under the GIL and may see the sum of one observation
more or less than the counts, which Prometheus tolerates. Each process keeps its own;
`--processes N` edges merge them at scrape time (`edge.obs.multiproc`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence


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

    def cumulative(self) -> tuple[list[tuple[float, int]], float]:
        """((upper bound, observations <= it) per bucket, +Inf last; sum): one snapshot."""
        counts, total_sum = list(self.counts), self.sum
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), counts, strict=True):
            running += n
            out.append((bound, running))
        return out, total_sum

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
