"""CPU and memory of the processes under test, from /proc, over the measured window.

`ProcWatch.start()` is called when measured requests begin (after warm-up), `stop()` when
the last one has ended: CPU time is utime + stime of each process tree (vLLM runs its
engine core in a child process) at stop minus at start, so a server's idle time before and
after a run, and the warm-up, are not counted. Resident memory is sampled every
`period_s` for its peak.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    """pid and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def _sample(pid: int) -> tuple[int, float]:
    """(resident KiB, CPU seconds) of one process; zeros if it is gone."""
    try:
        rss = 0
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return rss, (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0, 0.0


class ProcWatch:
    """Samples RSS and CPU of process trees in a thread; `stop()` returns the figures."""

    def __init__(self, pids: dict[str, int], period_s: float = 0.5) -> None:
        self.pids = pids
        self.period_s = period_s
        self._first: dict[str, tuple[int, float]] = {}
        self._last: dict[str, tuple[int, float]] = {}
        self._peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = 0.0

    def _measure(self) -> dict[str, tuple[int, float]]:
        out = {}
        for label, pid in self.pids.items():
            samples = [_sample(p) for p in _tree(pid)]
            out[label] = (sum(s[0] for s in samples), sum(s[1] for s in samples))
        return out

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._first = self._last = self._measure()
        self._peak = {k: v[0] for k, v in self._first.items()}
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._last = self._measure()
            for k, (rss, _) in self._last.items():
                self._peak[k] = max(self._peak.get(k, 0), rss)

    def stop(self) -> dict[str, dict[str, float]]:
        if not self._thread.is_alive():
            return {}  # never started (the run failed before measuring)
        self._stop.set()
        self._thread.join()
        self._last = self._measure()
        wall = max(1e-9, time.monotonic() - self._t0)
        out = {}
        for label in self.pids:
            rss0, cpu0 = self._first[label]
            rss1, cpu1 = self._last[label]
            out[label] = {
                "pid": self.pids[label],
                "rss_start_mib": round(rss0 / 1024, 1),
                "rss_peak_mib": round(max(self._peak[label], rss1) / 1024, 1),
                "rss_end_mib": round(rss1 / 1024, 1),
                "cpu_s": round(cpu1 - cpu0, 2),
                "cpu_pct": round(100 * (cpu1 - cpu0) / wall, 1),
            }
        return out
