"""The one real vLLM worker of a test session (SmolLM2-135M-Instruct): starting vLLM is
the slow part (~35 s on 2 CPU cores), so the model test modules share it. Requested only
by tests marked `model`. The worker also serves vLLM's own OpenAI server over its engine
(`vllm_openai`), for side-by-side checks without a second engine.

When the session runs the embeddings module, its pooling worker (`pooling_worker`) starts
beside the session worker rather than ~27 s of its own later: each start is mostly one
core's work, and the machine has two."""

from __future__ import annotations

import importlib.util
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import ROOT, Proc, start_worker, wait_serving

MAX_MODEL_LEN = 1024
MAX_NUM_SEQS = 32
# Where the session worker writes the port of vLLM's own server (`vllm_openai`).
VLLM_OPENAI_PORT = Path(tempfile.gettempdir()) / f"sluice-vllm-openai-port-{os.getpid()}"
# The pooling worker's (`test_model_embeddings.py`).
EMBED_MODULE = "test_model_embeddings.py"
EMBED_MAX_MODEL_LEN = 512
EMBED_OPENAI_PORT = Path(tempfile.gettempdir()) / f"sluice-vllm-embed-port-{os.getpid()}"
_early: dict[str, Proc] = {}  # started beside the session worker, by the module using it
_taken: set[str] = set()  # modules whose worker was asked for already: none started early


def _make_model() -> Path:
    spec = importlib.util.spec_from_file_location("make_model", ROOT / "scripts" / "make_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_model()


def _pooling_args(model_dir: Path) -> list[str]:
    return [
        "--engine", "vllm", "--model", str(model_dir), "--runner", "pooling",
        "--max-model-len", str(EMBED_MAX_MODEL_LEN), "--max-num-seqs", "8",
        "--kv-cache-space-gb", "0.1", "--enforce-eager", "--dtype", "float32",
        "--vllm-openai-port-file", str(EMBED_OPENAI_PORT),
        # The model in the engine core's process: one process start fewer (~5 s).
        "--distributed-executor-backend", "uni",
    ]  # fmt: skip


def pooling_worker() -> Proc:
    """The embeddings module's pooling worker, SERVING: the one started beside the session
    worker, else one started now. The caller ends it."""
    _taken.add(EMBED_MODULE)
    proc = _early.pop(EMBED_MODULE, None)
    if proc is None:
        proc = start_worker(*_pooling_args(_make_model()), startup_timeout=240, wait=False)
    try:
        wait_serving(proc.address, 240)
    except BaseException:
        proc.kill()
        raise
    return proc


@pytest.fixture(scope="session")
def vllm_worker(request: pytest.FixtureRequest) -> Iterator[Proc]:
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
        wait=False,
    )
    try:
        wanted = any(item.path.name == EMBED_MODULE for item in request.session.items)
        if wanted and EMBED_MODULE not in _taken:
            try:
                _early[EMBED_MODULE] = start_worker(
                    *_pooling_args(model_dir), startup_timeout=240, wait=False
                )
            except Exception as exc:  # its module starts its own (and reports why not)
                warnings.warn(f"the pooling worker did not start early: {exc}", stacklevel=1)
        wait_serving(w.address, 240)
        yield w
    finally:
        w.kill()  # its group: vLLM's graceful shutdown would cost the suite ~7 s
        for early in _early.values():  # its module did not run after all
            early.kill()
            EMBED_OPENAI_PORT.unlink(missing_ok=True)
        VLLM_OPENAI_PORT.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def vllm_openai(vllm_worker: Proc) -> str:
    """The base URL of vLLM's own OpenAI server over the session worker's engine."""
    return f"http://127.0.0.1:{int(VLLM_OPENAI_PORT.read_text())}"
