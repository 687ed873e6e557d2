"""The generation endpoints: chat, completions and browser streams share one prologue
(`_prepare`: parse, place, a `FailoverCall`, a `Job`); a resume goes to the worker its
event id names (`ResumeCall`). Plain ASGI endpoints (`edge.api.routes`), so every event
takes the one send path and no Starlette wrapper."""

from __future__ import annotations

import functools
import math
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

import grpc
from starlette.requests import Request
from starlette.responses import Response

from edge.api import affinity, background, bodies, priority, prompts, stored
from edge.api.formats import format_for
from edge.api.message_events import MessagesFormat
from edge.api.pages import ORJSONResponse
from edge.api.responses import ResponsesFormat
from edge.api.schema import GenRequest, Kind
from edge.api.sizes import most_tokens
from edge.api.state import EdgeState
from edge.api.tokens import routing_ids
from edge.errors import ApiError, from_status
from edge.obs import tracing
from edge.obs.logs import TRACE_RE
from edge.obs.record import record_of
from edge.routing.prefix import Prompt
from edge.stream.ids import PART_DONE, Origin, ResumePoint, bad_event_id, not_yours
from edge.stream.job import Format, Job
from edge.stream.response import GenerationResponse
from edge.upstream.calls import GenerateCall, ResumeCall, UpstreamCall
from edge.upstream.continuation import split_id
from edge.upstream.failover import FailoverCall, Route
from edge.upstream.session import open_session_call
from generated import sluice_pb2 as pb

TRACE_HEADER = "x-request-id"
LAST_EVENT_ID = "last-event-id"
STAMP_HEADER = "x-sluice-stamp-times"
TIMEOUT_HEADER = "x-request-timeout"  # seconds: the client's own deadline for the whole request
# What the official OpenAI SDK sends: its per-read timeout. For a non-streaming request
# nothing is read until the end, so it bounds the whole generation; a stream reads often.
OPENAI_READ_TIMEOUT_HEADER = "x-stainless-read-timeout"
_STAMPED_ID = re.compile(r"[0-9a-f]{32}")
_BROWSER = GenRequest(kind="chat", include_usage=True)  # what stream links render
# Formats whose events depend on all before them: a resume replays their one generation.
_REPLAYED = frozenset({"responses", "messages"})


def new_request_id() -> str:
    """32 hex digits: the creation time (Unix seconds, 8 digits), then 24 random ones. The
    time lets a resumed stream repeat the original chunks' `created` exactly, on any
    replica, without carrying it in event ids."""
    return f"{int(time.time()) & 0xFFFFFFFF:08x}{secrets.token_hex(12)}"


def created_at(request_id: str) -> int:
    """The `created` of a generation: from its id when the edge made it, else now."""
    head = request_id[:32]
    return int(head[:8], 16) if _STAMPED_ID.fullmatch(head) else int(time.time())


@dataclass(slots=True)
class Prepared:
    """A validated request with its routing: what every generation endpoint starts from."""

    req: GenRequest
    key: str  # the session key (affinity), "" for none
    request_id: str
    trace_id: str
    owner: bytes  # tag of the caller (API key name) bound into event ids and links
    body: bytes  # tag of the request itself (a resume must send the same one)
    start: pb.StartGeneration  # its request id and detach grace set by the endpoint
    conversation: stored.Conversation | None = None  # a Responses request's, to store


async def read_body(request: Request, limit: int) -> bytes:
    too_big = ApiError(413, f"request body is larger than {limit} bytes", code="request_too_large")
    length = request.headers.get("content-length")
    if length is not None and length.isascii() and length.isdigit() and int(length) > limit:
        raise too_big
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise too_big
    return bytes(body)


def trace_id(request: Request, request_id: str) -> str:
    """The client's X-Request-Id when it is a sane token, else ours: logs on both sides
    (edge and worker, via gRPC metadata) carry it."""
    given = request.headers.get(TRACE_HEADER, "")
    return given if TRACE_RE.fullmatch(given) else request_id


def timeout_s(request: Request, stream: bool, default: float) -> float:
    """The generation's deadline: the config's, shortened by the client's own if it sent one."""
    timeout = default
    names = (TIMEOUT_HEADER,) if stream else (TIMEOUT_HEADER, OPENAI_READ_TIMEOUT_HEADER)
    for name in names:
        raw = request.headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw)
        except ValueError:
            continue
        if math.isfinite(value) and value > 0:
            timeout = min(timeout, value)
    return timeout


async def read_json(state: EdgeState, request: Request) -> tuple[dict[str, Any], int]:
    """An API request's JSON object and its size in bytes (a 400, 413 or, while draining,
    503 otherwise); the bytes are kept for the audit log with `--audit-bodies`."""
    if state.draining:
        raise from_status(grpc.StatusCode.UNAVAILABLE, "this edge is shutting down")
    raw = await read_body(request, state.config.server.max_body_bytes)
    rec = record_of(request.scope)
    if rec.bodies:
        rec.request_body = raw
    return await bodies.decode(raw), len(raw)


async def _prepare(state: EdgeState, request: Request, kind: Kind) -> Prepared:
    cfg = state.config
    rec = record_of(request.scope)
    given, size = await read_json(state, request)
    conversation = None
    request_id = new_request_id()
    continues = kind == "responses" and given.get("previous_response_id") is not None
    kept = given.get("store") is True or given.get("background") is True
    if continues or (kind == "responses" and kept):
        # What it continues (`previous_response_id`), what it will store.
        history = []
        if continues:
            history = await stored.previous(state, rec.caller or "", given)
        conversation = stored.Conversation(history, stored.items(given.get("input"), request_id))
        if history:
            given = {**given, "input": [*history, *conversation.input]}
    req = await bodies.parse(kind, given, size, cfg.security)
    asked = request.headers.get(priority.HEADER)
    klass, tenant = state.priorities.of(asked, req.service_tier, rec.caller)  # 400/403 here
    rec.model = req.model
    reserve = rec.reserve
    if reserve is not None:  # a tokens-per-minute limit: 429 here, before any worker
        await reserve(most_tokens(req))
    owner = state.codec.tag(rec.caller or "")
    start = req.to_start("")  # the request alone, for its tag; then ours
    body = state.codec.tag(kind.encode() + b"|" + start.SerializeToString(deterministic=True))
    start.request_id = request_id
    start.priority, start.tenant = klass, tenant
    if asked is not None or req.service_tier is not None:  # say which class it got
        rec.headers.append((b"x-sluice-priority", priority.NAMES[start.priority].encode()))
    # The session key comes with the placement (`edge.api.affinity`, in `_failover`).
    trace = trace_id(request, request_id)
    return Prepared(req, "", request_id, trace, owner, body, start, conversation)


def _format(kind: Kind, request_id: str, model: str, req: GenRequest) -> Format:
    """The renderer of an endpoint's events and whole responses."""
    created = created_at(request_id)
    if kind == "responses":
        responses = ResponsesFormat(request_id, model, created, req.echo)
        responses.messages = req.return_prompt_text
        return responses
    if kind == "messages":
        return MessagesFormat(request_id, model)
    return format_for(kind, request_id, model, created, req)


async def _failover(
    state: EdgeState,
    request: Request,
    p: Prepared,
    detach_grace_s: float,
    timeout: float,
    stamps: bool = False,
) -> UpstreamCall:
    """The request's call: a `FailoverCall`, or for a completions batch a `BatchCall` of
    one per prompt (all placed with the first: one session, one placement)."""
    registry = state.workers()
    # The session's pool (pinned) and worker; its cookie and pool headers go out with the
    # response, whatever it turns out to be. The prompt is hashed only for a cache_aware or
    # kv_aware pool.
    req = p.req
    messages = None if req.messages is None else [(m.role, m.content) for m in req.messages]
    prompt = Prompt(messages, prompts.routed(req.prompts()[0]) if messages is None else None)
    if state.adapters is not None:
        await state.adapters.ensure(req.model)  # --lora-autoload
    if registry.routes_on_tokens():  # kv_aware: the engine's tokens, hashed as it does
        prompt.token_ids = await routing_ids(registry, req)
    worker, p.key = await tracing.route_awaiting(
        affinity.place(state.sessions(), state.cookies, request, req.model, req.user, prompt)
    )
    start = p.start
    start.detach_grace_ms = int(detach_grace_s * 1000)
    start.stamp_times = stamps
    # A Responses or Messages stream's events depend on all before them: it resumes by
    # replaying its one generation, so it is never continued as a second one elsewhere.
    continuable = req.kind not in _REPLAYED
    open_call = open_session_call if state.config.routing.upstream == "session" else GenerateCall

    def call(start: pb.StartGeneration, prompt: Prompt) -> FailoverCall:
        route = Route(req.model, p.key, prompt)
        return FailoverCall(
            registry,
            worker,
            start,
            timeout,
            p.trace_id,
            route=route,
            continuable=continuable,
            open_call=open_call,
        )

    if req.batch is None:
        return call(start, prompt)
    return prompts.batch_call(start, req.batch, req.n, call)


async def generate(state: EdgeState, request: Request, kind: Kind) -> Response | GenerationResponse:
    """POST /v1/chat/completions, /v1/completions, /v1/responses and /v1/messages."""
    cfg = state.config.stream
    p = await _prepare(state, request, kind)
    last_event_id = request.headers.get(LAST_EVENT_ID)
    if p.req.stream and last_event_id:  # a retried stream: continue it, don't start anew
        if p.req.batch is not None:
            raise ApiError(400, "a batch of prompts cannot be resumed", param="Last-Event-ID")
        point = state.codec.parse(last_event_id)
        if point.origin.owner != p.owner:
            raise not_yours()
        if point.origin.body != p.body:
            raise ApiError(
                400,
                "Last-Event-ID belongs to a generation started with another request body: "
                "resend the original request to resume it",
                param="Last-Event-ID",
                code="resume_body_mismatch",
            )
        return _resume(state, request, kind, point, p.req)
    if p.req.echo.get("background"):  # detached: runs on for --stream-grace without us
        call = await _failover(state, request, p, cfg.stream_grace_s, cfg.request_timeout_s)
        model = p.req.model or call.worker.model_id()
        return await background.launch(state, request, p, call, model)
    stamps = cfg.allow_stamps and request.headers.get(STAMP_HEADER) == "1"
    timeout = timeout_s(request, p.req.stream, cfg.request_timeout_s)
    call = await _failover(state, request, p, cfg.detach_grace_s, timeout, stamps)
    req = p.req
    model = req.model or call.worker.model_id()
    fmt = _format(kind, p.request_id, model, req)
    job = Job(
        request_id=p.request_id,
        trace_id=p.trace_id,
        call=call,
        fmt=fmt,
        model=model,
        stream=p.req.stream,
        logprobs=p.req.logprobs is not None,
        config=cfg,
        metrics=state.metrics,
        codec=state.codec,
        stamps=stamps,
        name_worker=True,
        owner=p.owner,
        body=p.body,
        rich=req.n > 1
        or req.batch is not None
        or bool(req.tools)
        or req.continuous_usage
        or req.return_token_ids
        or req.return_prompt_text
        or req.prompt_logprobs is not None
        or req.echo_prompt
        or kind in _REPLAYED,
    )
    if isinstance(fmt, ResponsesFormat) and req.echo.get("store") and p.conversation:
        caller = record_of(request.scope).caller or ""
        job.keep = functools.partial(stored.keep, state, caller, fmt, p.conversation)
    return GenerationResponse(job)


def _resume(
    state: EdgeState,
    request: Request,
    kind: Kind,
    point: ResumePoint,
    req: GenRequest,
    *,
    from_start: bool = False,
) -> Response | GenerationResponse:
    """Continue a generation from a resume point, through any edge replica: the worker is
    named by the (signed) point itself. `from_start`: a first GET of a stream link."""
    if point.part == PART_DONE:
        # The client has everything. 204 also tells EventSource to stop reconnecting.
        return Response(status_code=204)
    registry = state.workers()
    worker = registry.find(point.worker)
    trace = trace_id(request, point.request_id)
    cfg = state.config.stream
    original = split_id(point.request_id)[0]  # a continuation's chunks keep the stream's id
    model = req.model or worker.model_id()
    fmt = _format(kind, original, model, req)
    call = ResumeCall(
        worker,
        point.request_id,
        0 if fmt.replay_from_start else point.cursor,
        cfg.request_timeout_s,
        trace,
        on_end=lambda: registry.released(worker),
    )
    job = Job(
        request_id=original,
        trace_id=trace,
        call=call,
        fmt=fmt,
        model=model,
        stream=True,
        logprobs=False,
        config=cfg,
        metrics=state.metrics,
        codec=state.codec,
        resume=None if from_start else point,
        resumed="stream_link" if from_start else "last_event_id",
        owner=point.origin.owner,
        body=point.origin.body,
        rich=True,  # the original request's shape is not known here: any chunk may come
    )
    return GenerationResponse(job)


async def create_stream(state: EdgeState, request: Request) -> Response:
    """POST /v1/streams: start a chat generation for a browser; returns its stream link.

    The body is a chat completion request. The generation starts at once and runs detached
    (`--stream-grace`) until the link is opened with GET, which EventSource can do without
    headers; its automatic reconnects send Last-Event-ID and resume exactly.
    """
    cfg = state.config.stream
    p = await _prepare(state, request, "chat")
    call = await _failover(state, request, p, cfg.stream_grace_s, cfg.request_timeout_s)
    try:
        if not await call.admitted():
            await call.read()  # raises the refusal as an ApiError (400, 429, ...)
    finally:
        call.cancel()  # the worker keeps generating for the stream grace
    keep = record_of(request.scope).keep_slot
    if keep is not None:  # the key's stream slot stays taken while it may run
        state.detached.hold(call.request_id, keep())
    origin = Origin(call.request_id, call.worker.key, p.owner, p.body)
    token, expires = state.codec.stream_token(origin, cfg.stream_ttl_s)
    body = {
        "id": p.request_id,
        "object": "chat.completion.stream",
        "model": p.req.model or call.worker.model_id(),
        "stream_url": f"/v1/streams/{token}",
        "expires_at": expires,
    }
    return ORJSONResponse(body, status_code=201, headers={TRACE_HEADER: p.trace_id})


async def read_stream(
    state: EdgeState, request: Request, token: str
) -> Response | GenerationResponse:
    """GET /v1/streams/{token}: the generation as SSE, from the start or from the
    Last-Event-ID header (EventSource's reconnects) or `last_event_id` query parameter.

    The link is a capability (EventSource cannot send a key): whoever holds it may read
    the stream. Its event ids carry the creator's tag, so on the OpenAI endpoints they
    resume for the creator's key only."""
    origin = state.codec.open_stream(token)
    done = state.detached.reading(origin.request_id)
    if done is not None:
        rec = record_of(request.scope)
        rec.on_complete.append(lambda: done(rec.finish is not None))
    last = request.headers.get(LAST_EVENT_ID) or request.query_params.get("last_event_id")
    if last:
        point = state.codec.parse(last)
        if point.origin != origin:
            raise bad_event_id("it belongs to another stream")
        return _resume(state, request, "chat", point, _BROWSER)
    start = ResumePoint(origin, seq=-1, cursor=0)
    return _resume(state, request, "chat", start, _BROWSER, from_start=True)
