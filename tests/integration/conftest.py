"""The one real vLLM worker of a test session (SmolLM2-135M-Instruct): starting vLLM is
the slow part (~35 s on 2 CPU cores), so the model test modules share it. Requested only
by tests marked `model`. The worker also serves vLLM's own OpenAI server over its engine
(`vllm_openai`), for side-by-side checks without a second engine."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import ROOT, Proc, start_worker

MAX_MODEL_LEN = 1024
MAX_NUM_SEQS = 32
# Where the session worker writes the port of vLLM's own server (`vllm_openai`).
VLLM_OPENAI_PORT = Path(tempfile.gettempdir()) / f"sluice-vllm-openai-port-{os.getpid()}"


def _make_model() -> Path:
    spec = importlib.util.spec_from_file_location("make_model", ROOT / "scripts" / "make_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_model()


@pytest.fixture(scope="session")
def vllm_worker() -> Iterator[Proc]:
    model_dir = _make_model()
    w = start_worker(
        "--engine",
        "vllm",
        "--model",
        str(model_dir),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--kv-cache-space-gb",
        "0.5",
        "--enforce-eager",
        # The weights are bf16; bf16 arithmetic differs between CPUs with and without
        # AVX512-BF16, and greedy answers with it. fp32 gives every machine one answer.
        "--dtype",
        "float32",
        # Tool choice auto through vLLM's Hermes parser (`<tool_call>{...}</tool_call>`).
        "--tool-call-parser",
        "hermes",
        # vLLM's own server over the same engine (test only; ~1 s at start-up).
        "--vllm-openai-port-file",
        str(VLLM_OPENAI_PORT),
        # Its KV-cache events for kv_aware edges (WatchCache): a publisher thread in the
        # engine core, one msgpack batch per step that changed the cache.
        "--kv-events",
        # LoRA on (tests/integration/test_model_adapters.py loads adapters at run time).
        "--max-loras",
        "2",
        "--max-lora-rank",
        "8",
        # A role beyond OpenAI's five (SmolLM2's template renders any role), compared with
        # vLLM's server in test_model_vllm_shapes.py.
        "--chat-role",
        "ipython",
        startup_timeout=240,
    )
    yield w
    w.kill()  # its group: vLLM's graceful shutdown would cost the suite ~7 s
    VLLM_OPENAI_PORT.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def vllm_openai(vllm_worker: Proc) -> str:
    """The base URL of vLLM's own OpenAI server over the session worker's engine."""
    return f"http://127.0.0.1:{int(VLLM_OPENAI_PORT.read_text())}"
