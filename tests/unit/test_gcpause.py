"""`tune_gc` (both processes call it once serving): start-up's objects leave the collector's
scans, and young collections come less often."""

from __future__ import annotations

import re
import subprocess
import sys

from sluice_common.gcpause import GC_THRESHOLDS


def test_start_ups_objects_are_frozen_and_the_thresholds_set() -> None:
    # In a child: freezing this process's objects would outlast the test.
    code = (
        "import gc, json; from sluice_common.gcpause import tune_gc; "
        "kept = [[i] for i in range(10_000)]; tune_gc(); "
        "print(json.dumps([gc.get_freeze_count() >= 10_000, gc.get_threshold(), "
        "gc.get_count()[2]]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"[true, {list(GC_THRESHOLDS)}, 0]"


def test_a_slow_collection_is_logged_with_its_generation() -> None:
    # A bound of 0 s: every collection is slow; the one full collection (automatic ones
    # off) of a heap built after the freeze.
    code = (
        "import gc, logging; from sluice_common.gcpause import tune_gc; "
        "logging.basicConfig(format='%(name)s %(levelname)s %(message)s'); "
        "tune_gc(0.0); gc.disable(); later = [[i] for i in range(100_000)]; gc.collect(); "
        "print(sum(1 for cb in gc.callbacks if type(cb).__name__ == '_PauseClock'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = out.stderr.splitlines()
    assert out.stdout.strip() == "1"
    assert [re.sub(r"\d+ ms \(\d+", "N ms (N", line) for line in lines] == [
        "sluice.gc WARNING gc pause: a generation-2 collection held the process N ms "
        "(N objects freed)"
    ]
