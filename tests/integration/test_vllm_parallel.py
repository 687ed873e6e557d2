"""The parallelism flags reach the real vLLM's AsyncEngineArgs (vLLM imported, no engine
started), and a layout this machine cannot hold is refused before vLLM starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_service.config import build_parser, config_from_args
from model_service.engines.vllm.args import build_engine_args
from model_service.engines.vllm.parallel import this_node

pytestmark = pytest.mark.slow


def engine_config(model: Path, *argv: str):  # type: ignore[no-untyped-def]
    args = build_parser().parse_args(["--model", str(model), "--kv-cache-space-gb", "0.1", *argv])
    return config_from_args(args).engine


def test_parallel_flags_become_vllm_engine_args(tmp_path: Path) -> None:
    cfg = engine_config(
        tmp_path, "--tensor-parallel-size", "2", "--distributed-executor-backend", "mp"
    )
    args = build_engine_args(cfg)
    got = {
        k: getattr(args, k)
        for k in (
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "data_parallel_size",
            "distributed_executor_backend",
        )
    }
    assert got == {
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 1,
        "data_parallel_size": 1,
        "distributed_executor_backend": "mp",
    }


def test_more_ranks_than_this_machine_holds_is_refused(tmp_path: Path) -> None:
    node = this_node()
    ranks = max(node.cpus, node.gpus) + 1
    cfg = engine_config(tmp_path, "--tensor-parallel-size", str(ranks))
    with pytest.raises(RuntimeError, match=f"--tensor-parallel-size {ranks} x "):
        build_engine_args(cfg)
