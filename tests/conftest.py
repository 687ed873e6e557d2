"""The test run's own temporary directory: every file and socket a test, or a process it
starts (workers, vLLM's engine sockets, edges, Redis, nginx), puts in the temporary
directory goes under one `sluice-tests-*` directory (TMPDIR), removed when the run
passes; kept, and named, when it fails (the processes' logs are there). Torch's compile
cache stays where it was (it lives in the temporary directory by default, and a cold one
costs each vLLM start seconds)."""

from __future__ import annotations

import getpass
import os
import shutil
import tempfile

import pytest

_RUN_DIR = ""


def pytest_configure(config: pytest.Config) -> None:
    global _RUN_DIR
    inductor = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", inductor)  # torch's own default
    _RUN_DIR = tempfile.mkdtemp(prefix="sluice-tests-")
    os.environ["TMPDIR"] = _RUN_DIR  # for the processes the tests start
    tempfile.tempdir = _RUN_DIR  # for this one


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _RUN_DIR:
        return
    if exitstatus == 0:
        shutil.rmtree(_RUN_DIR, ignore_errors=True)
    else:
        print(f"\nthe run's temporary files and process logs: {_RUN_DIR}")
