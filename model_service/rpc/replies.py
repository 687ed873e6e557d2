"""The replies of `ListModels`, `GetStats` and `WatchLoad`, domain to protobuf."""

from __future__ import annotations

from generated import sluice_pb2 as pb
from model_service.types import EngineStats, LoadFigures, ModelInfo


def model_info_to_pb(info: ModelInfo) -> pb.ModelInfo:
    return pb.ModelInfo(
        id=info.id,
        max_model_len=info.max_model_len,
        engine=info.engine,
        version=info.version,
        default_max_tokens=info.default_max_tokens,
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
    )
