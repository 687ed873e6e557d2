"""Protobuf <-> domain conversion, pure functions: engine code never sees protobuf."""

from __future__ import annotations

from generated import sluice_pb2 as pb
from model_service.errors import InvalidArgument, SluiceError
from model_service.types import (
    ChatMessage,
    EngineOutput,
    EngineStats,
    FinishReason,
    GenerationRequest,
    LoadFigures,
    ModelInfo,
    SamplingParams,
)

FINISH_TO_PB = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
    FinishReason.ERROR: pb.FINISH_REASON_ERROR,
}


def sampling_from_pb(sp: pb.SamplingParams) -> SamplingParams:
    """Apply the contract's defaults to the optional fields."""
    return SamplingParams(
        max_tokens=sp.max_tokens if sp.HasField("max_tokens") else None,
        temperature=sp.temperature if sp.HasField("temperature") else 1.0,
        top_p=sp.top_p if sp.HasField("top_p") else 1.0,
        top_k=sp.top_k if sp.HasField("top_k") else 0,
        seed=sp.seed if sp.HasField("seed") else None,
        stop=tuple(sp.stop),
        presence_penalty=sp.presence_penalty,
        frequency_penalty=sp.frequency_penalty,
        repetition_penalty=sp.repetition_penalty if sp.HasField("repetition_penalty") else 1.0,
        n=sp.n or 1,
        logprobs=sp.logprobs if sp.HasField("logprobs") else None,
        ignore_eos=sp.ignore_eos,
        min_tokens=sp.min_tokens,
    )


def _chat_from_pb(chat: pb.ChatInput) -> tuple[tuple[ChatMessage, ...], bool]:
    messages = tuple(ChatMessage(m.role, m.content) for m in chat.messages)
    add = chat.add_generation_prompt if chat.HasField("add_generation_prompt") else True
    return messages, add


def request_from_pb(start: pb.StartGeneration) -> GenerationRequest:
    """A StartGeneration as a domain request (validation happens separately)."""
    which = start.WhichOneof("input")
    if which is None:
        raise InvalidArgument("input", "set either `chat` or `prompt`")
    req = GenerationRequest(
        request_id=start.request_id,
        sampling=sampling_from_pb(start.sampling),
        model=start.model,
        timeout_s=start.timeout_ms / 1000 if start.timeout_ms else None,
    )
    if which == "chat":
        req.messages, req.add_generation_prompt = _chat_from_pb(start.chat)
    else:
        req.prompt = start.prompt
    return req


def tokenize_request_from_pb(t: pb.TokenizeRequest) -> GenerationRequest:
    """A TokenizeRequest as a domain request carrying only the input."""
    start = pb.StartGeneration(model=t.model)
    if t.HasField("chat"):
        start.chat.CopyFrom(t.chat)
    elif t.HasField("prompt"):
        start.prompt = t.prompt
    return request_from_pb(start)


def chunk_to_pb(request_id: str, index: int, out: EngineOutput) -> pb.GenerateResponse:
    """A token delta as a response message (filled in place: no nested copies)."""
    msg = pb.GenerateResponse(request_id=request_id, index=index)
    chunk = msg.chunk
    chunk.text = out.text
    chunk.token_ids.extend(out.token_ids)
    if out.logprobs:
        chunk.logprobs.extend(
            pb.TokenLogprob(
                token_id=lp.token_id,
                logprob=lp.logprob,
                text=lp.text,
                top=[
                    pb.TopLogprob(token_id=t.token_id, text=t.text, logprob=t.logprob)
                    for t in lp.top
                ],
            )
            for lp in out.logprobs
        )
    return msg


def status_to_pb(err: SluiceError) -> pb.Status:
    return pb.Status(
        code=err.code.value[0],
        message=err.message,
        field=err.field,
        retry_after_ms=int(err.retry_after_s * 1000),
    )


def final_to_pb(
    request_id: str,
    index: int,
    reason: FinishReason,
    usage: tuple[int, int, int],
    timing_us: tuple[int, int, int],
    *,
    stop_sequence: str = "",
    error: SluiceError | None = None,
) -> pb.GenerateResponse:
    """The last message of a generation. usage = (prompt, completion, cached)."""
    msg = pb.GenerateResponse(request_id=request_id, index=index)
    final = msg.final
    final.reason = FINISH_TO_PB[reason]
    u = final.usage
    u.prompt_tokens, u.completion_tokens, u.cached_prompt_tokens = usage
    t = final.timing
    t.queue_us, t.time_to_first_token_us, t.total_us = timing_us
    if stop_sequence:
        final.stop_sequence = stop_sequence
    if error is not None:
        final.error.CopyFrom(status_to_pb(error))
    return msg


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
