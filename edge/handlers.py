"""HTTP handlers: thin. Parse and validate, pick a worker, hand a `Job` to the response."""

from __future__ import annotations

import math
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from edge.config import EdgeConfig
from edge.errors import ApiError, internal_error, no_worker
from edge.failover import FailoverCall, RoutedResponse
from edge.limits import check_prompt
from edge.metrics import CONTENT_TYPE, Metrics
from edge.openai_format import make_format
from edge.openai_schema import Kind, parse
from edge.pools import PoolRegistry
from edge.resume import PART_DONE, ResumeCodec, ResumePoint, bad_event_id
from edge.routing import session_key
from edge.security import stamps_wanted
from edge.stream import GenerationResponse, Job
from edge.upstream import GenerateCall, ResumeCall

TRACE_HEADER = "x-request-id"
LAST_EVENT_ID = "last-event-id"
CHAT_PAGE = Path(__file__).parent / "static" / "chat.html"
_TRACE_RE = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")
TIMEOUT_HEADER = "x-request-timeout"  # seconds: the client's own deadline for the whole request
# What the official OpenAI SDK sends: its per-read timeout. For a non-streaming request
# nothing is read until the end, so it bounds the whole generation; a stream reads often.
OPENAI_READ_TIMEOUT_HEADER = "x-stainless-read-timeout"


@dataclass(slots=True)
class EdgeState:
    """What handlers share: config, workers (set at startup), metrics, the draining flag."""

    config: EdgeConfig
    metrics: Metrics = field(default_factory=Metrics)
    workers: PoolRegistry | None = None
    draining: bool = False
    codec: ResumeCodec = field(init=False)

    def __post_init__(self) -> None:
        secret = self.config.resume_secret
        self.codec = ResumeCodec(bytes.fromhex(secret) if secret else os.urandom(32))


class ORJSONResponse(Response):
    media_type = "application/json"

    def render(self, content: object) -> bytes:
        return orjson.dumps(content)


def _state(request: Request) -> EdgeState:
    return request.app.state.edge  # type: ignore[no-any-return]


def error_response(err: ApiError) -> Response:
    return Response(
        err.json(), status_code=err.status, headers=err.headers(), media_type="application/json"
    )


async def _read_body(request: Request, limit: int) -> bytes:
    too_big = ApiError(413, f"request body is larger than {limit} bytes", code="request_too_large")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_big
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise too_big
    return bytes(body)


def _trace_id(request: Request, request_id: str) -> str:
    """The client's X-Request-Id when it is a sane token, else ours: logs on both sides
    (edge and worker, via gRPC metadata) carry it."""
    given = request.headers.get(TRACE_HEADER, "")
    return given if _TRACE_RE.fullmatch(given) else request_id


def _timeout_s(request: Request, stream: bool, config: EdgeConfig) -> float:
    """The generation's deadline: the config's, shortened by the client's own if it sent one."""
    timeout = config.request_timeout_s
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


async def _generate(request: Request, kind: Kind) -> Response | GenerationResponse:
    state = _state(request)
    cfg = state.config
    req = parse(kind, await _read_body(request, cfg.max_body_bytes))
    check_prompt(req, cfg.max_prompt_chars)
    workers = _workers(state)
    last_event_id = request.headers.get(LAST_EVENT_ID)
    if req.stream and last_event_id:  # a retried stream: continue it, don't start anew
        point = state.codec.parse(last_event_id)
        return _resume_response(request, state, kind, point, req.include_usage)
    key = session_key(request.headers, request.cookies, req.user)  # affinity, see routing
    worker = workers.pick(req.model, key)
    request_id = uuid.uuid4().hex
    trace = _trace_id(request, request_id)
    start = req.to_start(request_id, detach_grace_ms=int(cfg.detach_grace_s * 1000))
    start.stamp_times = stamps_wanted(request.headers, cfg)
    timeout = _timeout_s(request, req.stream, cfg)
    call = FailoverCall(workers, worker, start, timeout, trace, key, req.model)
    model = req.model or worker.model_id()
    fmt = make_format(kind, request_id, model, int(time.time()), req.include_usage)
    job = Job(
        route=request.url.path,
        request_id=request_id,
        trace_id=trace,
        call_factory=lambda: call,
        fmt=fmt,
        stream=req.stream,
        logprobs=req.logprobs is not None,
        config=cfg,
        metrics=state.metrics,
        id_prefix=state.codec.prefix(request_id, worker.key),
        stamps=start.stamp_times,
    )
    return RoutedResponse(job, call, state.codec)


def _workers(state: EdgeState) -> PoolRegistry:
    if state.workers is None:
        raise no_worker()
    return state.workers


def _resume_response(
    request: Request,
    state: EdgeState,
    kind: Kind,
    point: ResumePoint,
    include_usage: bool,
    *,
    from_start: bool = False,
) -> Response | GenerationResponse:
    """Continue a generation from a resume point, through any edge replica: the worker is
    named by the (signed) point itself. `from_start`: a first GET of a stream link."""
    if point.part == PART_DONE:
        # The client has everything. 204 also tells EventSource to stop reconnecting.
        return Response(status_code=204)
    workers = _workers(state)
    worker = workers.find(point.worker)
    trace = _trace_id(request, point.request_id)
    timeout = state.config.request_timeout_s
    fmt = make_format(kind, point.request_id, worker.model_id(), int(time.time()), include_usage)
    job = Job(
        route=request.url.path,
        request_id=point.request_id,
        trace_id=trace,
        call_factory=lambda: ResumeCall(
            worker,
            point.request_id,
            point.cursor,
            timeout,
            trace,
            on_end=lambda: workers.released(worker),
        ),
        fmt=fmt,
        stream=True,
        logprobs=False,
        config=state.config,
        metrics=state.metrics,
        id_prefix=state.codec.prefix(point.request_id, point.worker),
        resume=None if from_start else point,
        resumed="stream_link" if from_start else "last_event_id",
    )
    return GenerationResponse(job)


async def create_stream(request: Request) -> Response:
    """POST /v1/streams: start a chat generation for a browser; returns its stream link.

    The body is a chat completion request. The generation starts at once and runs detached
    (`--stream-grace`) until the link is opened with GET, which EventSource can do without
    headers; its automatic reconnects send Last-Event-ID and resume exactly.
    """
    state = _state(request)
    cfg = state.config
    req = parse("chat", await _read_body(request, cfg.max_body_bytes))
    check_prompt(req, cfg.max_prompt_chars)
    key = session_key(request.headers, request.cookies, req.user)
    worker = _workers(state).pick(req.model, key)
    request_id = uuid.uuid4().hex
    trace = _trace_id(request, request_id)
    start = req.to_start(request_id, detach_grace_ms=int(cfg.stream_grace_s * 1000))
    call = GenerateCall(worker, start, cfg.request_timeout_s, trace)
    try:
        if not await call.admitted():
            await call.read()  # raises the refusal as an ApiError (400, 429, ...)
    finally:
        call.cancel()  # the worker keeps generating for the stream grace
    token, expires = state.codec.stream_token(request_id, worker.key, cfg.stream_ttl_s)
    body = {
        "id": request_id,
        "object": "chat.completion.stream",
        "model": req.model or worker.model_id(),
        "stream_url": f"/v1/streams/{token}",
        "expires_at": expires,
    }
    return ORJSONResponse(body, status_code=201, headers={TRACE_HEADER: trace})


async def read_stream(request: Request) -> Response | GenerationResponse:
    """GET /v1/streams/{token}: the generation as SSE, from the start or from the
    Last-Event-ID header (EventSource's reconnects) or `last_event_id` query parameter."""
    state = _state(request)
    request_id, worker = state.codec.open_stream(request.path_params["token"])
    last = request.headers.get(LAST_EVENT_ID) or request.query_params.get("last_event_id")
    if last:
        point = state.codec.parse(last)
        if point.request_id != request_id or point.worker != worker:
            raise bad_event_id("it belongs to another stream")
        return _resume_response(request, state, "chat", point, include_usage=True)
    start = ResumePoint(request_id, worker, seq=-1, cursor=0)
    return _resume_response(request, state, "chat", start, include_usage=True, from_start=True)


async def chat_page(request: Request) -> Response:
    """GET /: the chat page (plain HTML and JavaScript, no build step, no CDN)."""
    return Response(CHAT_PAGE.read_bytes(), media_type="text/html; charset=utf-8")


async def chat_completions(request: Request) -> Response | GenerationResponse:
    """POST /v1/chat/completions"""
    return await _generate(request, "chat")


async def completions(request: Request) -> Response | GenerationResponse:
    """POST /v1/completions"""
    return await _generate(request, "completion")


async def list_models(request: Request) -> Response:
    """GET /v1/models: the models of every SERVING worker, asked now (ListModels)."""
    state = _state(request)
    workers = [w for w in state.workers.workers if w.serving] if state.workers else []
    if not workers:
        raise no_worker()
    seen: dict[str, dict[str, object]] = {}
    last_error: ApiError | None = None
    for w in workers:
        try:
            models = await w.list_models()
        except ApiError as err:
            last_error = err
            continue
        for m in models:
            seen.setdefault(
                m.id,
                {
                    "id": m.id,
                    "object": "model",
                    "created": 0,
                    "owned_by": "sluice",
                    "max_model_len": m.max_model_len,
                    "engine": m.engine,
                    "version": m.version,
                },
            )
    if not seen and last_error is not None:
        raise last_error
    return ORJSONResponse({"object": "list", "data": list(seen.values())})


async def healthz(request: Request) -> Response:
    """The process is up and its event loop answers."""
    return ORJSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready when at least one worker is SERVING and the edge is not draining."""
    state = _state(request)
    workers = state.workers.workers if state.workers else []
    ready = (
        bool(workers) and state.workers is not None and state.workers.ready() and not state.draining
    )
    body = {
        "ready": ready,
        "draining": state.draining,
        # Worker keys, not addresses: this endpoint is public (as resume ids, it never
        # shows internal addresses).
        "workers": [{"worker": w.key, "serving": w.serving} for w in workers],
    }
    return ORJSONResponse(body, status_code=200 if ready else 503)


async def metrics(request: Request) -> Response:
    """Prometheus text exposition."""
    state = _state(request)
    serving = sum(w.serving for w in state.workers.workers) if state.workers else 0
    return Response(state.metrics.render(serving), media_type=CONTENT_TYPE)


async def on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc)


async def on_http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405/...: same error object as everything else."""
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    err = ApiError(exc.status_code, exc.detail, type=kind, code=f"http_{exc.status_code}")
    return Response(
        err.json(), status_code=exc.status_code, headers=exc.headers, media_type="application/json"
    )


async def on_unexpected(request: Request, exc: Exception) -> Response:
    """A bug in the edge: the client gets a plain 500 object, the log gets the traceback."""
    return error_response(internal_error())
