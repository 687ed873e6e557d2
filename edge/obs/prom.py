"""Prometheus text exposition: the one renderer every part of the edge uses.

Counters and gauges are (labels, value) samples; histograms are `edge.obs.histogram`
objects. Kept hand-written (no registry, no locks): the edge's hot path only adds to
plain ints and lists, and a scrape renders them.
"""

from __future__ import annotations

from collections.abc import Iterable

from sluice_common.histogram import Histogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def number(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


def labels(**values: object) -> str:
    """`a="x",b="y"` (values are ours: route templates, pool names, codes)."""
    return ",".join(f'{k}="{v}"' for k, v in values.items())


class Exposition:
    """Lines of one scrape, family by family."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(
        self, name: str, kind: str, help_: str, samples: Iterable[tuple[str, float]]
    ) -> None:
        """A counter or gauge family; `samples` are (labels as from `labels()`, value)."""
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} {kind}")
        for lbl, value in samples:
            head = f"{name}{{{lbl}}}" if lbl else name
            self.lines.append(f"{head} {number(value)}")

    def histograms(self, name: str, help_: str, series: Iterable[tuple[str, Histogram]]) -> None:
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} histogram")
        for lbl, h in series:
            self.lines.extend(h.samples(name, lbl))

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
