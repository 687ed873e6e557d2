"""`python -m tests.gc_edge ARGS`: the edge (`python -m edge ARGS`) with the collector
keeping what it finds (`gc.DEBUG_SAVEALL`) from the moment the edge serves; on SIGUSR1 it
collects and writes what it found, by type, to `$SLUICE_GARBAGE_FILE` (JSON). A request
whose objects hold each other in a cycle shows there: only a collection frees them, and
with thousands of streams open a collection holds every stream's events (issue 22)."""

from __future__ import annotations

import collections
import gc
import os
import runpy
import signal
import sys
from types import FrameType

import orjson

import sluice_common.gcpause as gcpause

_tune_gc = gcpause.tune_gc


def _dump(signum: int, frame: FrameType | None) -> None:
    gc.collect()
    found = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage)
    gc.garbage.clear()
    path = os.environ["SLUICE_GARBAGE_FILE"]
    with open(path + ".tmp", "wb") as f:
        f.write(orjson.dumps(dict(found), option=orjson.OPT_SORT_KEYS))
    os.replace(path + ".tmp", path)


def _tune_and_keep(*args: object, **kwargs: object) -> None:
    _tune_gc(*args, **kwargs)  # type: ignore[arg-type]
    gc.set_debug(gc.DEBUG_SAVEALL)
    signal.signal(signal.SIGUSR1, _dump)


if __name__ == "__main__":
    gcpause.tune_gc = _tune_and_keep  # before `edge.__main__` imports it
    sys.argv = ["edge", *sys.argv[1:]]
    runpy.run_module("edge", run_name="__main__")
