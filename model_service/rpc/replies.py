"""The replies of `ListModels`, `LoadAdapter`, `Embed`, `GetStats` and `WatchLoad`, domain
to protobuf."""

from __future__ import annotations

from collections.abc import Iterable

from generated import sluice_pb2 as pb
from model_service.types import Adapter, EngineStats, LoadFigures, ModelInfo

TASKS = {"generate": pb.TASK_GENERATE, "embed": pb.TASK_EMBED}


def models_to_pb(base: ModelInfo, adapters: Iterable[Adapter], slots: int) -> pb.ListModelsResponse:
    """The base model (with its adapter slots), then its adapters (each with `parent`, as
    vLLM lists them)."""
    first = model_info_to_pb(base)
    first.max_adapters = slots
    return pb.ListModelsResponse(models=[first, *(adapter_to_pb(a, base) for a in adapters)])


def adapter_to_pb(adapter: Adapter, base: ModelInfo) -> pb.ModelInfo:
    info = model_info_to_pb(base)
    info.id, info.parent, info.path = adapter.name, base.id, adapter.path
    return info


def model_info_to_pb(info: ModelInfo) -> pb.ModelInfo:
    return pb.ModelInfo(
        id=info.id,
        max_model_len=info.max_model_len,
        engine=info.engine,
        version=info.version,
        default_max_tokens=info.default_max_tokens,
        task=TASKS[info.task],
        embedding_size=info.embedding_size,
    )


def embeddings_to_pb(vectors: list[list[float]], tokens: list[int]) -> pb.EmbedResponse:
    """`Embed`'s reply: a vector and its input's tokens per input, the tokens summed."""
    pairs = zip(vectors, tokens, strict=True)
    return pb.EmbedResponse(
        embeddings=[pb.Embedding(values=v, prompt_tokens=n) for v, n in pairs],
        usage=pb.Usage(prompt_tokens=sum(tokens)),
    )


def stats_to_pb(
    stats: EngineStats, *, draining: bool, finished: int, rejected: int, drain_rate: float
) -> pb.WorkerStats:
    return pb.WorkerStats(
        running=stats.running,
        waiting=stats.waiting,
        max_running=stats.max_running,
        kv_cache_usage=stats.kv_cache_usage,
        draining=draining,
        finished_total=finished,
        rejected_total=rejected,
        spec_draft_tokens=stats.spec_draft_tokens,
        spec_accepted_tokens=stats.spec_accepted_tokens,
        drain_rate=drain_rate,
    )


def load_to_pb(figures: LoadFigures, seq: int) -> pb.WorkerLoad:
    """One `WatchLoad` message."""
    f = figures
    return pb.WorkerLoad(
        running=f.running,
        waiting=f.waiting,
        max_running=f.max_running,
        kv_cache_usage=f.kv_cache_usage,
        draining=f.draining,
        prefix_cache_hit_rate=f.prefix_cache_hit_rate,
        tokens_per_s=f.tokens_per_s,
        prefix_cache_queried_tokens=f.prefix_cache_queried_tokens,
        prefix_cache_hit_tokens=f.prefix_cache_hit_tokens,
        generated_tokens=f.generated_tokens,
        kv_cache_tokens=f.kv_cache_tokens,
        seq=seq,
        models_version=f.models_version,
        active_adapters=f.active_adapters,
    )
