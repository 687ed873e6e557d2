"""Background Responses (`background: true`): a stored response whose generation runs on
its worker detached from the request. The POST answers once a worker accepted it (or
streams it); `GET /v1/responses/{id}` polls it (`?stream=true&starting_after=N`: its
events after N, the worker's log replayed, the same bytes on any replica); `.../cancel`
aborts it. One edge process follows it into the stored document (ARCHITECTURE.md)."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from edge.api import stored
from edge.api.pages import ORJSONResponse
from edge.api.responses import ResponsesFormat
from edge.api.runs import lease_key
from edge.errors import ApiError, invalid
from edge.obs.record import RequestRecord, record_of
from edge.store.base import StoreUnavailable
from edge.stream.ids import Origin, ResumePoint
from edge.stream.job import Job, final_error
from edge.stream.response import GenerationResponse
from edge.upstream.abort import abort
from edge.upstream.calls import ResumeCall, UpstreamCall
from generated import sluice_pb2 as pb

if TYPE_CHECKING:
    from edge.api.generate import Prepared
    from edge.api.state import EdgeState

log = logging.getLogger("sluice.edge")
TERMINAL = frozenset({"completed", "incomplete", "failed", "cancelled"})
Doc = dict[str, Any]


def response_format(run: dict[str, Any]) -> ResponsesFormat:
    """The renderer of a background response's events, as every replica makes it."""
    fmt = ResponsesFormat(run["request_id"], run["model"], run["created"], run["echo"])
    fmt.messages = run["messages"]
    return fmt


async def _put(state: EdgeState, key: str, doc: Doc) -> bool:
    """Write `doc` unless it was deleted meanwhile; False if it was not written."""
    store = stored.store_of(state)
    try:
        if await store.get_doc(key) is None:
            return False
        await store.put_doc(key, orjson.dumps(doc).decode(), state.config.store.responses_ttl_s)
    except StoreUnavailable as exc:
        log.warning("background response %s not updated: %s", key, exc)
        return False
    return True


async def follow(state: EdgeState, key: str, doc: Doc, call: UpstreamCall) -> Doc:
    """Read the generation to its end through the Responses format and keep the terminal
    response (`completed`, `incomplete`, `cancelled` or `failed`) in the stored document;
    its usage goes to the ledger (once per generation, whoever follows it)."""
    run = doc["run"]
    fmt = response_format(run)
    logprobs = "top_logprobs" in run["echo"]
    final: pb.Final | None = None
    error: Any = None
    try:
        if not await call.admitted():
            await call.read()  # raises the refusal
        started = doc["response"]["status"] != "queued"
        while True:
            msg = await call.read()
            if msg.WhichOneof("kind") == "final":
                final = msg.final
                break
            fmt.collect(msg.chunk, fmt.logprobs(msg.chunk) if logprobs else None)
            if not started:
                started = True
                # Where it runs now: a retry before the first token moves it.
                run["worker"], run["generation"] = call.worker.key, call.request_id
                await _put(state, key, {**doc, "response": fmt.snapshot("in_progress")})
    except ApiError as err:
        error = {"code": err.code or "server_error", "message": err.message}
    except Exception:
        log.exception("background response %s failed in the edge", key)
        error = {"code": "internal_error", "message": "internal error in the edge"}
    finally:
        call.cancel()
    failure = final_error(final) if final is not None else None
    if failure is not None:
        error = {"code": failure.code or "server_error", "message": failure.message}
    if error is None and final is not None:
        response = fmt.whole(final, logprobs)
    elif final is not None and final.reason == pb.FINISH_REASON_CANCELLED:
        response = fmt.stopped("cancelled", final)
    else:
        response = fmt.stopped("failed", final, error)
    doc = {**doc, "response": response}
    if await _put(state, key, doc) and final is not None and state.usage is not None:
        rec = RequestRecord("/v1/responses", caller=run["owner_name"], tenant=run["tenant"],
                            model=run["model"], generation=run["request_id"])  # fmt: skip
        u = final.usage
        rec.prompt_tokens, rec.completion_tokens = u.prompt_tokens, u.completion_tokens
        rec.cached_tokens = u.cached_prompt_tokens
        state.usage(rec)
    return doc


def _resume_call(state: EdgeState, run: dict[str, Any], trace: str) -> ResumeCall:
    """The generation's log from its start, on the worker that holds it (410 when this
    edge no longer knows that worker)."""
    registry = state.workers()
    worker = registry.find(run["worker"])
    timeout = state.config.stream.request_timeout_s
    return ResumeCall(worker, run["generation"], 0, timeout, trace,
                      on_end=lambda: registry.released(worker))  # fmt: skip


async def launch(
    state: EdgeState, request: Request, p: Prepared, call: UpstreamCall, model: str
) -> Response | GenerationResponse:
    """POST /v1/responses with `background: true`: wait until a worker accepted it (a
    refusal keeps its HTTP status), store it as `queued`, follow it here; answer with the
    response, or (`stream: true`) its events."""
    try:
        if not await call.admitted():
            await call.read()  # raises the refusal as an ApiError (400, 429, ...)
    except BaseException:
        call.cancel()
        raise
    req, rec = p.req, record_of(request.scope)
    run = {
        "request_id": p.request_id, "worker": call.worker.key, "generation": call.request_id,
        "model": model,
        "created": int(p.request_id[:8], 16), "echo": req.echo,
        "messages": req.return_prompt_text, "owner": p.owner.hex(), "body": p.body.hex(),
        "owner_name": rec.caller or "", "tenant": rec.tenant,
    }  # fmt: skip
    conversation = p.conversation or stored.Conversation()
    doc = {"response": response_format(run).snapshot("queued"), "input": conversation.input,
           "context": conversation.context, "run": run}  # fmt: skip
    key = stored.doc_key(rec.caller or "", f"resp_{p.request_id}")
    try:
        text = orjson.dumps(doc).decode()
        await stored.store_of(state).put_doc(key, text, state.config.store.responses_ttl_s)
    except StoreUnavailable as exc:
        call.cancel()
        raise stored.unavailable(exc) from None
    keep = rec.keep_slot
    release = keep() if keep is not None else None
    state.background.start(key, follow(state, key, doc, call), stored.store_of(state), release)
    if req.stream:
        return _reader(state, doc, -1, "")
    return ORJSONResponse(doc["response"])


def _reader(state: EdgeState, doc: Doc, after: int, resumed: str) -> GenerationResponse:
    """The response's events after `sequence_number` `after`, replayed from the worker's
    log: the same bytes on every replica and every read."""
    run = doc["run"]
    origin = Origin(run["generation"], run["worker"], bytes.fromhex(run["owner"]),
                    bytes.fromhex(run["body"]))  # fmt: skip
    cfg = state.config.stream
    job = Job(
        request_id=run["request_id"],
        trace_id=run["request_id"],
        call=_resume_call(state, run, run["generation"]),
        fmt=response_format(run),
        model=run["model"],
        stream=True,
        logprobs="top_logprobs" in run["echo"],
        config=cfg,
        metrics=state.metrics,
        codec=state.codec,
        resume=ResumePoint(origin, seq=after, cursor=0),
        resumed=resumed,
        owner=origin.owner,
        body=origin.body,
        rich=True,
    )
    return GenerationResponse(job)


async def _adopt(state: EdgeState, key: str, doc: Doc) -> None:
    """Follow a running background response here if nobody holds its run lease (the
    process that started it is gone)."""
    if doc["response"]["status"] in TERMINAL or state.background.running(key):
        return
    try:
        if await stored.store_of(state).get_doc(lease_key(key)) is not None:
            return
    except StoreUnavailable:
        return
    try:
        call = _resume_call(state, doc["run"], doc["run"]["generation"])
    except ApiError:  # a worker this replica does not know: left to one that does
        log.warning("background response %s: its worker is unknown here", key)
        return
    log.info("following background response %s (its run lease lapsed)", key)
    if not state.background.start(key, follow(state, key, doc, call), stored.store_of(state)):
        call.cancel()


def _starting_after(request: Request) -> int:
    raw = request.query_params.get("starting_after")
    if raw is None:
        return -1
    if not (raw.isascii() and raw.isdigit() and len(raw) < 10):
        raise invalid("starting_after", "'starting_after' must be a sequence number (0 or more)")
    return int(raw)


async def response(request: Request) -> Response | GenerationResponse:
    """GET /v1/responses/{id} (`?stream=true&starting_after=N` for a background one's
    events) and DELETE: `edge.api.stored.response`, a background one followed here if
    its run lease lapsed."""
    if request.method != "GET":
        return await stored.response(request)
    stream = request.query_params.get("stream", "false")
    if stream not in ("true", "false"):
        raise invalid("stream", "'stream' must be true or false")
    after = _starting_after(request)
    state: EdgeState = request.app.state.edge
    response_id, doc = await stored.found(request)
    if "run" not in doc:
        if stream == "true":
            raise invalid("stream", "only a background response can be streamed")
        return ORJSONResponse(doc["response"])
    key = stored.doc_key(stored.owner_of(request), response_id)
    await _adopt(state, key, doc)
    if stream == "true":
        return _reader(state, doc, after, "background")
    return ORJSONResponse(doc["response"])


async def cancel(request: Request) -> Response:
    """POST /v1/responses/{id}/cancel: a background response cancelled on its worker from
    any replica; its response as it ended (a finished one as it is, as OpenAI's)."""
    state: EdgeState = request.app.state.edge
    response_id, doc = await stored.found(request)
    if "run" not in doc:
        raise ApiError(400, "Responses can only be cancelled if they were created with "
                       "background=true.", param="response_id", code="invalid_value")  # fmt: skip
    if doc["response"]["status"] in TERMINAL:
        return ORJSONResponse(doc["response"])
    key = stored.doc_key(stored.owner_of(request), response_id)
    run = doc["run"]
    worker = state.workers().find_worker(run["worker"])
    ended: Doc | None = None
    if worker is not None:
        await abort(worker, run["generation"])
        with contextlib.suppress(ApiError):
            ended = await follow(state, key, doc, _resume_call(state, run, run["generation"]))
    if ended is None or ended["response"]["status"] == "failed":  # its log is gone
        ended = {**doc, "response": {**doc["response"], "status": "cancelled"}}
        await _put(state, key, ended)
    return ORJSONResponse(ended["response"])
