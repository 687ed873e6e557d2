"""PNG plot of a benchmark: latency distributions (CDFs) and throughput over time.

matplotlib is a development dependency (the `dev` extra); without it the harness still
writes its JSON and markdown and says the plot was skipped.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from scripts.bench.load import LoadResult
from scripts.bench.stats import series

MAX_POINTS = 5000


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


MIN_MS = 0.001  # log axes: events read together (gap 0) are drawn at 1 us


def _cdf(values_ns: list[int]) -> tuple[list[float], list[float]]:
    vals = sorted(values_ns)
    n = len(vals)
    step = max(1, n // MAX_POINTS)
    idx = list(range(0, n, step))
    if idx and idx[-1] != n - 1:
        idx.append(n - 1)
    return [max(MIN_MS, vals[i] / 1e6) for i in idx], [(i + 1) / n for i in idx]


def _styles(results: list[LoadResult]) -> list[dict[str, str]]:
    """One color per target, one line style per round ("label #2")."""
    bases: list[str] = []
    styles = []
    dashes = ("-", "--", ":", "-.")
    for res in results:
        base, _, rnd = res.label.partition(" #")
        if base not in bases:
            bases.append(base)
        i = int(rnd) - 1 if rnd.isdigit() else 0
        styles.append({"color": f"C{bases.index(base) % 10}", "linestyle": dashes[i % 4]})
    return styles


def write_png(results: list[LoadResult], path: Path, title: str) -> Path | None:
    """Four panels: TTFT, inter-token and worker->client (or end-to-end) latency CDFs, and
    tokens/s per second of the run. Returns the path, or None without matplotlib."""
    if not available():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (ax_ttft, ax_itl), (ax_lat, ax_tput) = axes
    use_stamps = any(r.stamp_lat_ns for res in results for r in res.records)
    for res, style in zip(results, _styles(results), strict=True):
        ok = [r for r in res.records if r.ok]
        panels = [
            (ax_ttft, [r.first_ns - r.start_ns for r in ok if r.first_ns]),
            (ax_itl, [g for r in ok for g in r.itl_ns()]),
            (
                ax_lat,
                [s for r in ok for s in r.stamp_lat_ns] if use_stamps else [r.e2e_ns for r in ok],
            ),
        ]
        for ax, values in panels:
            if values:
                x, y = _cdf(values)
                ax.plot(x, y, label=res.label, **style)
        pts = [p for p in series(res, ok) if p["width_s"] >= 0.25]  # skip a stub last bucket
        ax_tput.plot(
            [p["t"] + p["width_s"] / 2 for p in pts],
            [p["tokens_per_s"] for p in pts],
            marker=".",
            label=res.label,
            **style,
        )
    lat_title = "worker → client latency (stamps)" if use_stamps else "end-to-end latency"
    for ax, name in (
        (ax_ttft, "time to first token"),
        (ax_itl, "inter-token (event) latency"),
        (ax_lat, lat_title),
    ):
        ax.set_title(name)
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction ≤ x")
        ax.set_xscale("log")
        lo, hi = ax.get_xlim()
        wide = hi > 0 and lo > 0 and hi / lo > 1000  # many decades: 1-2-5 labels collide
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0,) if wide else (1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, alpha=0.3)
    ax_tput.set_title("throughput")
    ax_tput.set_xlabel("s since start")
    ax_tput.set_ylabel("tokens/s")
    ax_tput.grid(True, alpha=0.3)
    for ax in axes.flat:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle("\n".join(textwrap.wrap(title, 140)), fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
