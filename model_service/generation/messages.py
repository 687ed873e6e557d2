"""A generation's messages as protobuf, pure functions: what its log holds."""

from __future__ import annotations

from generated import sluice_pb2 as pb
from model_service.errors import SluiceError
from model_service.types import EngineOutput, FinishReason, TokenLogprob, ToolCallDelta, TopLogprob

FINISH_TO_PB = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
    FinishReason.ERROR: pb.FINISH_REASON_ERROR,
    FinishReason.TOOL_CALLS: pb.FINISH_REASON_TOOL_CALLS,
}


def chunk_to_pb(
    request_id: str,
    index: int,
    out: EngineOutput,
    choice: int = 0,
    calls: list[ToolCallDelta] | None = None,
) -> pb.GenerateResponse:
    """A token delta as a response message (filled in place: no nested copies)."""
    msg = pb.GenerateResponse(request_id=request_id, index=index)
    chunk = msg.chunk
    chunk.text = out.text
    chunk.token_ids.extend(out.token_ids)
    if out.reasoning:
        chunk.reasoning = out.reasoning
    if choice:
        chunk.choice = choice
    if calls:
        chunk.tool_calls.extend(
            pb.ToolCallDelta(index=c.index, id=c.id, name=c.name, arguments=c.arguments)
            for c in calls
        )
    if out.logprobs:
        chunk.logprobs.extend(logprobs_to_pb(out.logprobs))
    return msg


def logprobs_to_pb(entries: list[TokenLogprob]) -> list[pb.TokenLogprob]:
    return [
        pb.TokenLogprob(
            token_id=lp.token_id,
            logprob=lp.logprob,
            text=lp.text,
            rank=lp.rank,
            top=[_top(t) for t in lp.top],
        )
        for lp in entries
    ]


def _top(t: TopLogprob) -> pb.TopLogprob:
    return pb.TopLogprob(token_id=t.token_id, text=t.text, logprob=t.logprob)


def prompt_to_pb(
    request_id: str, index: int, ids: list[int] | None, logprobs: list[TokenLogprob] | None
) -> pb.GenerateResponse:
    """The prompt's own message: its token ids and/or log-probabilities (as asked)."""
    msg = pb.GenerateResponse(request_id=request_id, index=index)
    msg.chunk.SetInParent()
    if ids is not None:
        msg.chunk.prompt_token_ids.extend(ids)
    if logprobs is not None:
        msg.chunk.prompt_logprobs.extend(logprobs_to_pb(logprobs))
    return msg


def with_end_and_usage(
    msg: pb.GenerateResponse, end: pb.ChoiceEnd | None, usage: tuple[int, int, int] | None
) -> pb.GenerateResponse:
    """A chunk message with its choice's end and the usage so far (prompt, completion,
    cached), where given."""
    if end is not None:
        msg.chunk.choice_end.CopyFrom(end)
    if usage is not None:
        u = msg.chunk.usage
        u.prompt_tokens, u.completion_tokens, u.cached_prompt_tokens = usage
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
    choices: list[pb.ChoiceEnd] | None = None,
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
    if choices:
        final.choices.extend(choices)
    return msg


def choice_end_to_pb(reason: FinishReason, stop: str, completion_tokens: int) -> pb.ChoiceEnd:
    return pb.ChoiceEnd(
        reason=FINISH_TO_PB[reason], stop_sequence=stop, completion_tokens=completion_tokens
    )
