"""The test run's own temporary directory: what the tests put in the temporary directory
(each started process's directory with its log and port file, Redis's directories,
pytest's tmp_path) goes under one `sluice-tests-*` directory, removed when the run passes;
kept, and named, when it fails. The processes themselves keep the system's TMPDIR: vLLM
started ~10 s slower (31 vs 41 s, twice each) with a fresh one."""

from __future__ import annotations

import shutil
import tempfile

import pytest

_RUN_DIR = ""


def pytest_configure(config: pytest.Config) -> None:
    global _RUN_DIR
    _RUN_DIR = tempfile.mkdtemp(prefix="sluice-tests-")
    tempfile.tempdir = _RUN_DIR  # this process's temporary files only


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _RUN_DIR:
        return
    if exitstatus == 0:
        shutil.rmtree(_RUN_DIR, ignore_errors=True)
    else:
        print(f"\nthe run's temporary files and process logs: {_RUN_DIR}")
