"""Models bigger than one GPU, on vLLM's own machinery: the parallelism flags go to
`AsyncEngineArgs` under the same names and vLLM starts the ranks (`mp` on one node, `ray`
across nodes). What can be checked before vLLM spends a minute starting is checked here,
naming the flag."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from model_service.config import VllmOptions

BACKENDS = ("mp", "ray", "uni", "external_launcher")
SIZE_FLAGS = (
    ("tensor_parallel_size", "--tensor-parallel-size"),
    ("pipeline_parallel_size", "--pipeline-parallel-size"),
    ("data_parallel_size", "--data-parallel-size"),
)


@dataclass(frozen=True, slots=True)
class Node:
    """What this machine offers the engine."""

    gpus: int  # accelerators visible to this process (0 on a CPU machine)
    cpus: int
    ray: bool  # the `ray` package is importable


def engine_kwargs(opts: VllmOptions) -> dict[str, object]:
    """The AsyncEngineArgs keys for the options; defaults are left to vLLM."""
    kwargs: dict[str, object] = {
        name: getattr(opts, name) for name, _ in SIZE_FLAGS if getattr(opts, name) != 1
    }
    if opts.distributed_executor_backend:
        kwargs["distributed_executor_backend"] = opts.distributed_executor_backend
    return kwargs


def check(opts: VllmOptions, node: Node) -> None:
    """RuntimeError, naming the flag, for a layout this node cannot start."""
    for name, flag in SIZE_FLAGS:
        if getattr(opts, name) < 1:
            raise RuntimeError(f"{flag} must be at least 1, got {getattr(opts, name)}")
    backend = opts.distributed_executor_backend
    if backend is not None and backend not in BACKENDS:
        raise RuntimeError(
            f"--distributed-executor-backend must be one of {', '.join(BACKENDS)}; got {backend!r}"
        )
    per_replica = opts.tensor_parallel_size * opts.pipeline_parallel_size
    ranks = per_replica * opts.data_parallel_size
    if backend == "uni" and per_replica > 1:
        raise RuntimeError(
            "--distributed-executor-backend uni runs one process; tensor or pipeline "
            "parallel sizes above 1 need mp (one node) or ray (several nodes)"
        )
    if backend == "ray":
        if not node.ray:
            raise RuntimeError(
                "--distributed-executor-backend ray needs the ray package in the worker's "
                "environment (pip install 'ray[default]') and a Ray cluster (`ray start`)"
            )
        return  # the ranks may live on other nodes: Ray places them, vLLM checks the count
    layout = (
        f"--tensor-parallel-size {opts.tensor_parallel_size} x --pipeline-parallel-size "
        f"{opts.pipeline_parallel_size} x --data-parallel-size {opts.data_parallel_size}"
    )
    if node.gpus == 0:
        if ranks > node.cpus:
            raise RuntimeError(
                f"{layout} = {ranks} ranks; this CPU machine has {node.cpus} cores "
                "(vLLM's CPU backend gives each rank its own cores)"
            )
        return
    if ranks > node.gpus:
        raise RuntimeError(
            f"{layout} needs {ranks} GPUs; {node.gpus} visible on this node. For more than "
            "one node use --distributed-executor-backend ray (README: models bigger than "
            "one GPU)"
        )


def this_node() -> Node:
    """The GPUs vLLM's platform sees (imports vLLM), the CPU cores, and whether Ray exists."""
    from vllm.platforms import current_platform

    gpus = 0
    if not current_platform.is_cpu():
        count = getattr(current_platform, "device_count", None)
        if count is None:
            import torch

            count = torch.cuda.device_count
        gpus = int(count())
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return Node(gpus=gpus, cpus=cpus or 1, ray=importlib.util.find_spec("ray") is not None)
