"""The edge shares only `generated/` with the worker: no engine, no worker code."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("vllm", "torch", "model_service")


def test_edge_imports_no_engine_or_worker_code() -> None:
    code = (
        "import sys, edge.__main__, edge.app;"
        f"print([m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
