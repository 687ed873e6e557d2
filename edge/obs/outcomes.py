"""Per-pool outcomes: attempts by outcome, TTFT and inter-token histograms, and a sliding
window (error rate, percentiles) for the canary and the admin API. An attempt counts for
its own pool, so a failing canary shows its errors even when clients were rescued
elsewhere; "cancelled" (the client left) is neither a success nor an error."""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass

from edge.obs.prom import Exposition, labels
from sluice_common.histogram import Histogram

OK = "ok"
CANCELLED = "cancelled"
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
WINDOW_CAP = 20_000  # outcomes kept per pool at most, whatever the window length
MAX_WINDOW_S = 3600.0  # and none older than this
# (monotonic time, is_error, ttft or None, mean inter-token gap or None)
Outcome = tuple[float, bool, float | None, float | None]


@dataclass(slots=True)
class WindowStats:
    """What a pool's window says now."""

    requests: int  # outcomes counted (cancelled ones excluded)
    errors: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p99_s: float | None = None  # of the attempts' mean inter-token gaps

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "error_rate": round(self.error_rate, 4),
            "ttft_p50_ms": None if self.ttft_p50_s is None else round(self.ttft_p50_s * 1000, 2),
            "ttft_p99_ms": None if self.ttft_p99_s is None else round(self.ttft_p99_s * 1000, 2),
            "itl_p99_ms": None if self.itl_p99_s is None else round(self.itl_p99_s * 1000, 3),
        }


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 1))))
    return sorted_values[rank - 1]


class PoolMetrics:
    """Counters, histograms and the recent window of one pool."""

    def __init__(self, collect: bool = False) -> None:
        self.outcomes: dict[str, int] = {}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.continuations = 0
        self.rollbacks = 0
        # Cancelled attempts are not kept.
        self._window: deque[Outcome] = deque(maxlen=WINDOW_CAP)
        self.window_start = time.monotonic()  # a fresh window counts from here
        # With a shared store: the outcomes not yet added to the fleet's window
        # (`edge.release.windows` swaps the list out; None: not collecting).
        self.pending: list[Outcome] | None = [] if collect else None

    def outcome(
        self,
        code: str,
        ttft_s: float | None,
        now: float | None = None,
        itl_s: float | None = None,
    ) -> None:
        self.outcomes[code] = self.outcomes.get(code, 0) + 1
        if code != CANCELLED:
            t = time.monotonic() if now is None else now
            entry = (t, code != OK, ttft_s, itl_s)
            self._window.append(entry)
            if self.pending is not None:
                self.pending.append(entry)

    def clear_window(self, now: float | None = None) -> None:
        self._window.clear()
        self.window_start = time.monotonic() if now is None else now

    def window(self, window_s: float, now: float | None = None) -> WindowStats:
        t = time.monotonic() if now is None else now
        while self._window and self._window[0][0] < t - MAX_WINDOW_S:
            self._window.popleft()
        since = t - window_s
        recent = list(itertools.takewhile(lambda e: e[0] >= since, reversed(self._window)))
        errors = sum(1 for e in recent if e[1])
        ttfts = sorted(e[2] for e in recent if e[2] is not None)
        itls = sorted(e[3] for e in recent if e[3] is not None)
        return WindowStats(
            len(recent),
            errors,
            percentile(ttfts, 0.5),
            percentile(ttfts, 0.99),
            percentile(itls, 0.99),
        )

    def nth_since(self, since: float, n: int) -> float | None:
        """When the n-th outcome at or after `since` came (None: fewer so far)."""
        newest_first = reversed(self._window)
        recent = [e[0] for e in itertools.takewhile(lambda e: e[0] >= since, newest_first)]
        return recent[-n] if n > 0 and len(recent) >= n else None


def expose(out: Exposition, pools: dict[str, PoolMetrics]) -> None:
    """Every pool's counters and histograms, into one scrape."""
    ordered = sorted(pools.items())
    out.family(
        "sluice_edge_pool_requests_total",
        "counter",
        "Upstream attempts by pool and outcome.",
        [
            (labels(pool=pool, outcome=code), v)
            for pool, m in ordered
            for code, v in sorted(m.outcomes.items())
        ],
    )
    out.histograms(
        "sluice_edge_pool_ttft_seconds",
        "Time to first token per attempt.",
        [(labels(pool=pool), m.ttft) for pool, m in ordered],
    )
    out.histograms(
        "sluice_edge_pool_inter_token_seconds",
        "Time between tokens (each attempt's mean, weighted by its gaps).",
        [(labels(pool=pool), m.itl) for pool, m in ordered],
    )
    out.family(
        "sluice_edge_pool_continuations_total",
        "counter",
        "Streams continued on this pool.",
        [(labels(pool=pool), m.continuations) for pool, m in ordered],
    )
    out.family(
        "sluice_edge_pool_rollbacks_total",
        "counter",
        "Automatic canary rollbacks.",
        [(labels(pool=pool), m.rollbacks) for pool, m in ordered],
    )
