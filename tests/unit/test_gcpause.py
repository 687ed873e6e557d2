"""`tune_gc` (both processes call it once serving): start-up's objects leave the collector's
scans, young collections come less often, and a slow collection is logged. Each in a child
process: freezing this process's objects would outlast the test."""

from __future__ import annotations

import re
import subprocess
import sys

from sluice_common.gcpause import GC_THRESHOLDS

PRELUDE = "import gc, json, logging; from sluice_common.gcpause import tune_gc; "


def _child(code: str) -> tuple[str, list[str]]:
    """Standard output and the lines of standard error of `code` run after `PRELUDE`."""
    out = subprocess.run(
        [sys.executable, "-c", PRELUDE + code], capture_output=True, text=True, check=True
    )
    return out.stdout.strip(), out.stderr.splitlines()


def test_start_ups_objects_are_frozen_and_the_thresholds_set() -> None:
    # A collection of the little left unfrozen is fast: not logged at the default bound.
    printed, lines = _child(
        "logging.basicConfig(); kept = [[i] for i in range(10_000)]; tune_gc(); "
        "print(json.dumps([gc.get_freeze_count() >= 10_000, gc.get_threshold(), "
        "gc.get_count()[2]])); gc.collect()"
    )
    assert (printed, lines) == (f"[true, {list(GC_THRESHOLDS)}, 0]", [])


def test_a_slow_collection_is_logged_with_its_generation() -> None:
    # The second call's bound, 0 s, for what follows it (its own collection ran under the
    # first's 60 s): with automatic collections off, the one full collection of a heap
    # built after the freeze is logged, once (one clock however often `tune_gc` runs).
    printed, lines = _child(
        "logging.basicConfig(format='%(name)s %(levelname)s %(message)s'); "
        "gc.disable(); tune_gc(60.0); tune_gc(0.0); later = [[i] for i in range(100_000)]; "
        "gc.collect(); print(sum(1 for cb in gc.callbacks if type(cb).__name__ == '_PauseClock'))"
    )
    assert printed == "1"
    assert [re.sub(r"\d+ ms \(\d+", "N ms (N", line) for line in lines] == [
        "sluice.gc WARNING gc pause: a generation-2 collection took N ms (N objects freed)"
    ]
