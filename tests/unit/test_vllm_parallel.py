"""vLLM's parallelism flags: CLI -> options -> AsyncEngineArgs keys, and the start checks."""

from __future__ import annotations

import pytest

from model_service.config import VllmOptions, build_parser, config_from_args
from model_service.engines.vllm.parallel import Node, check, engine_kwargs

GPU8 = Node(gpus=8, cpus=64, ray=False)


def opts(*argv: str) -> VllmOptions:
    return config_from_args(build_parser().parse_args(list(argv))).engine.vllm


def test_defaults_leave_parallelism_to_vllm() -> None:
    assert engine_kwargs(opts()) == {}
    check(opts(), Node(gpus=0, cpus=1, ray=False))


def test_flags_map_to_vllm_names() -> None:
    o = opts(
        "--tensor-parallel-size", "4", "--pipeline-parallel-size", "2",
        "--data-parallel-size", "1", "--distributed-executor-backend", "ray",
    )  # fmt: skip
    assert engine_kwargs(o) == {
        "tensor_parallel_size": 4,
        "pipeline_parallel_size": 2,
        "distributed_executor_backend": "ray",
    }


@pytest.mark.parametrize(
    ("argv", "node", "message"),
    [
        (("--tensor-parallel-size", "0"), GPU8, "--tensor-parallel-size must be at least 1, got 0"),
        (
            ("--tensor-parallel-size", "4", "--pipeline-parallel-size", "4"),
            GPU8,
            "--tensor-parallel-size 4 x --pipeline-parallel-size 4 x --data-parallel-size 1 "
            "needs 16 GPUs; 8 visible on this node. For more than one node use "
            "--distributed-executor-backend ray (README: models bigger than one GPU)",
        ),
        (
            ("--tensor-parallel-size", "2", "--data-parallel-size", "2"),
            Node(gpus=0, cpus=2, ray=False),
            "--tensor-parallel-size 2 x --pipeline-parallel-size 1 x --data-parallel-size 2 = "
            "4 ranks; this CPU machine has 2 cores (vLLM's CPU backend gives each rank its own "
            "cores)",
        ),
        (
            ("--tensor-parallel-size", "2", "--distributed-executor-backend", "uni"),
            GPU8,
            "--distributed-executor-backend uni runs one process; tensor or pipeline parallel "
            "sizes above 1 need mp (one node) or ray (several nodes)",
        ),
        (
            ("--tensor-parallel-size", "16", "--distributed-executor-backend", "ray"),
            GPU8,
            "--distributed-executor-backend ray needs the ray package in the worker's "
            "environment (pip install 'ray[default]') and a Ray cluster (`ray start`)",
        ),
    ],
)
def test_layouts_this_node_cannot_start_are_refused_naming_the_flag(argv, node, message) -> None:
    with pytest.raises(RuntimeError) as err:
        check(opts(*argv), node)
    assert str(err.value) == message


def test_ray_places_ranks_beyond_this_node() -> None:
    o = opts("--tensor-parallel-size", "8", "--pipeline-parallel-size", "2",
             "--distributed-executor-backend", "ray")  # fmt: skip
    check(o, Node(gpus=8, cpus=64, ray=True))  # 16 ranks, 8 here: Ray's cluster has the rest
    check(opts("--tensor-parallel-size", "8"), GPU8)
