"""What a stream is made of: the `Job` a handler hands over, the `Format` its events are
rendered with (`edge.api.formats` implements it), and how a `final` reads."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from edge.config import StreamConfig
from edge.errors import ApiError, from_status, from_status_code_number
from edge.obs.metrics import Metrics
from edge.obs.record import RequestRecord
from edge.stream.ids import ResumeCodec, ResumePoint
from edge.upstream.calls import UpstreamCall
from generated import sluice_pb2 as pb

FINISH_REASONS = {
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_TOOL_CALLS: "tool_calls",
}
Event = tuple[bytes | None, bytes]  # (SSE event name or None for a plain `data:`, data)


class Format(Protocol):
    """How one stream's events and whole response look (`edge.api.formats`,
    `edge.api.responses`). `seq` is the edge's counter of the first event asked for:
    formats that number their events (the Responses API) use it."""

    # Resumes replay the generation from its start and skip what the client has (the
    # format's events depend on all that came before), instead of from the event's message.
    replay_from_start: bool

    def prompts_due(self) -> bool:
        """Read another of the prompts' messages (their token ids, logprobs) before the
        opening."""
        ...

    def note_prompt(self, chunk: pb.TokenChunk) -> bool:
        """Keep what a prompt's message carries; False: `chunk` is no such message."""
        ...

    def opening_events(self, seq: int) -> list[Event]: ...
    def delta(self, text: str, logprobs: list[dict[str, Any]] | None) -> bytes: ...
    def events(
        self, chunk: pb.TokenChunk, logprobs: list[dict[str, Any]] | None, seq: int
    ) -> list[Event]: ...
    def ending(self, final: pb.Final, seq: int) -> list[Event]: ...
    def logprobs(self, chunk: pb.TokenChunk) -> list[dict[str, Any]]: ...
    def collect(self, chunk: pb.TokenChunk, logprobs: list[dict[str, Any]] | None) -> None: ...
    def whole(self, final: pb.Final, logprobs: bool) -> dict[str, Any]: ...


@dataclass(slots=True)
class Job:
    """What a handler hands to the response: one validated generation, ready to run."""

    request_id: str  # ours, unique: the chunk ids
    trace_id: str  # the client's X-Request-Id if it sent a usable one, else request_id
    call: UpstreamCall
    fmt: Format
    stream: bool
    logprobs: bool
    config: StreamConfig
    metrics: Metrics
    codec: ResumeCodec
    model: str = ""  # the model asked for, else the worker's (records, usage)
    resume: ResumePoint | None = None  # set when this response continues a stream
    # How this response continues a generation: "" (a new one), "last_event_id" or
    # "stream_link" (a first GET of /v1/streams/{token}); counted as resumes.
    resumed: str = ""
    stamps: bool = False  # put the worker's `worker_time_ns` into chunks (benchmarks)
    name_worker: bool = False  # send `x-sluice-worker: <key>` (routed generations)
    owner: bytes = b""  # `ResumeCodec.tag`s bound into every event id: the principal...
    body: bytes = b""  # ... and the request that started the generation
    # Token events through `Format.events` (n > 1, tools, usage per chunk, resumes, the
    # Responses API) rather than the plain-text `Format.delta` fast path.
    rich: bool = False
    # Run once the generation ended well, before its last event (or whole body) goes out:
    # a stored Responses response is kept there (`edge.api.stored.keep`).
    keep: Callable[[], Awaitable[None]] | None = None


def final_error(final: pb.Final) -> ApiError | None:
    """A `final` that is not a success (CANCELLED, ERROR) as the error to report."""
    if final.reason in FINISH_REASONS:
        return None
    if final.HasField("error") and final.error.code:
        e = final.error
        code = from_status_code_number(e.code)
        return from_status(code, e.message, field=e.field, retry_after_ms=e.retry_after_ms)
    if final.reason == pb.FINISH_REASON_CANCELLED:
        return from_status(grpc.StatusCode.CANCELLED, "the generation was cancelled")
    return from_status(grpc.StatusCode.UNKNOWN, "the generation failed")


def note_final(rec: RequestRecord | None, final: pb.Final, generation: str) -> None:
    """The generation's usage, as its whole stream's (a continuation's final counts the
    tokens before it): a resume that replays it notes the same generation id, so usage
    accounting counts it once."""
    if rec is not None:
        usage = final.usage
        rec.prompt_tokens, rec.completion_tokens = usage.prompt_tokens, usage.completion_tokens
        rec.cached_tokens = usage.cached_prompt_tokens
        rec.finish, rec.generation = pb.FinishReason.Name(final.reason), generation


async def read_prompts(call: UpstreamCall, fmt: Format) -> pb.GenerateResponse | None:
    """Read the prompts' messages the format's opening shows (`Format.prompts_due`); the
    last message read (a prompt's, or whatever came instead), to be handled as usual."""
    msg = None
    while fmt.prompts_due():
        msg = await call.read()
        if not (msg.HasField("chunk") and fmt.note_prompt(msg.chunk)):
            break
    return msg
