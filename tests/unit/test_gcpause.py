"""`tune_gc` (both processes call it once serving): start-up's objects leave the collector's
scans, and young collections come less often."""

from __future__ import annotations

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
