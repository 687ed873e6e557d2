"""`--processes N` metrics: each process writes its exposition to `<dir>/<pid>.prom` (a
temporary file, renamed) every `INTERVAL_S` and at exit; a scrape of any writes its own
fresh and merges them all (`merge`). An exited process still counts with what it last
wrote, as Prometheus's own multiprocess mode keeps dead processes' counters."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from pathlib import Path

INTERVAL_S = 0.5


def _combine(family: str, kind: str, old: float, new: float) -> float:
    if kind in ("counter", "histogram") or "in_flight" in family:
        return old + new
    if family.endswith("start_time_seconds"):
        return min(old, new)
    return max(old, new)


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


def merge(texts: Iterable[str]) -> str:
    """Several processes' expositions as one (see the module docstring)."""
    order: list[str] = []
    meta: dict[str, list[str]] = {}
    kinds: dict[str, str] = {}
    samples: dict[str, dict[str, float]] = {}
    for text in texts:
        family = ""
        for line in text.splitlines():
            if line.startswith("# HELP "):
                family = line.split(" ", 3)[2]
                if family not in meta:
                    order.append(family)
                    meta[family] = [line]
                    samples[family] = {}
            elif line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ", 3)
                if name not in kinds:
                    kinds[name] = kind
                    meta.setdefault(name, []).append(line)
            elif line and not line.startswith("#") and family:
                head, _, raw = line.rpartition(" ")
                value = float(raw)
                series = samples[family]
                if head in series:
                    value = _combine(family, kinds.get(family, "gauge"), series[head], value)
                series[head] = value
    out: list[str] = []
    for family in order:
        out.extend(meta[family])
        out.extend(f"{head} {_number(v)}" for head, v in samples[family].items())
    return "\n".join(out) + "\n"


class SharedMetrics:
    """This process's part of a shared metrics directory (see the module docstring)."""

    def __init__(self, directory: str, render: Callable[[], bytes]) -> None:
        self.dir = Path(directory)
        self.path = self.dir / f"{os.getpid()}.prom"
        self.render = render

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(self.render())
        os.replace(tmp, self.path)

    def collect(self) -> bytes:
        """Every process's metrics, this one's fresh."""
        self.write()
        texts = []
        for path in sorted(self.dir.glob("*.prom")):
            try:
                texts.append(path.read_text())
            except OSError:  # a file replaced while listed: the next scrape has it
                continue
        return merge(texts).encode()

    async def run(self) -> None:
        """Write every INTERVAL_S until cancelled, then once more."""
        try:
            while True:
                self.write()
                await asyncio.sleep(INTERVAL_S)
        finally:
            self.write()
