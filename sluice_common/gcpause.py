"""`tune_gc`: after start-up, what exists lives as long as the process, so the collector
stops scanning it (`gc.freeze`): a full collection of a worker's heap (vLLM, torch and
transformers imported: ~630,000 objects) held its loop ~380 ms, every stream with it.
Young collections run less often: each open stream allocates with every event."""

from __future__ import annotations

import gc

# At the default 700 allocations per young collection, thousands of streams keep the
# collector busy (BENCHMARKS.md, issue 11's target 3).
GC_THRESHOLDS = (50_000, 20, 20)


def tune_gc() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
