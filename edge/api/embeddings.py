"""`POST /v1/embeddings`: OpenAI's embeddings (and vLLM's truncation and normalization
options) over a pooling worker's `Embed`, one RPC per request. Routed by `model` to
workers whose model embeds (`ModelInfo.task`); a refusal before the worker answered
(UNAVAILABLE, RESOURCE_EXHAUSTED, a broken call) is tried on another, as a generation's.
Auth, limits and usage are the generations' (the middleware knows the path; `rec`
carries the usage: prompt tokens, no completion)."""

from __future__ import annotations

import array
import base64
import sys
import time
from dataclasses import dataclass
from typing import Any

import grpc
from starlette.requests import Request
from starlette.responses import Response

from edge.api import fields, priority
from edge.api.generate import new_request_id, read_json, timeout_s, trace_id
from edge.api.pages import ORJSONResponse
from edge.api.state import EdgeState
from edge.errors import ApiError, from_rpc_error, invalid
from edge.obs.outcomes import CANCELLED, OK
from edge.obs.record import record_of
from edge.upstream.failover import PASSIVE_FAILURES
from edge.upstream.worker import Worker
from generated import sluice_pb2 as pb
from sluice_common.contract import TRACE_KEY

MAX_INPUTS = 2048  # OpenAI's limit
UINT32_MAX = 2**32 - 1
# Statuses after which the same request may go to another worker: nothing was embedded
# (UNKNOWN: a worker killed mid-call).
RETRIED = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNKNOWN}
)


@dataclass(slots=True)
class EmbedBody:
    """A parsed body: the `Embed` to send, and how to answer."""

    request: pb.EmbedRequest
    base64: bool
    service_tier: str | None
    cost: int  # tokens at most, for a tokens-per-minute reservation


def _is_id(v: Any) -> bool:
    return type(v) is int and 0 <= v <= UINT32_MAX


def read_inputs(value: Any) -> list[str | list[int]]:
    """`input`'s forms: a string, token ids, a list of strings, a list of token-id lists."""
    if isinstance(value, str):
        inputs: list[Any] = [value]
    elif isinstance(value, list) and value and all(_is_id(v) for v in value):
        inputs = [value]
    elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        inputs = value
    elif isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        inputs = value
        for i, ids in enumerate(inputs):
            if not ids or not all(_is_id(v) for v in ids):
                raise invalid(
                    f"input[{i}]",
                    f"'input[{i}]' must be a non-empty list of token ids (0 to {UINT32_MAX})",
                )
    else:
        raise invalid(
            "input",
            "'input' must be a string, a non-empty list of token ids, or a list of strings "
            "or of token-id lists",
        )
    if len(inputs) > MAX_INPUTS:
        raise invalid("input", f"'input' holds {len(inputs)} inputs, more than {MAX_INPUTS}")
    for i, one in enumerate(inputs):
        if one == "":
            where = "input" if len(inputs) == 1 else f"input[{i}]"
            raise invalid(where, f"'{where}' must not be an empty string")
    return inputs


def _int(body: dict[str, Any], name: str, lo: int, hi: int = UINT32_MAX) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if type(v) is not int or not lo <= v <= hi:
        raise invalid(name, f"'{name}' must be an integer from {lo} to {hi}")
    return v


def _choice(body: dict[str, Any], name: str, allowed: tuple[str, ...]) -> str | None:
    v = body.get(name)
    if v is not None and v not in allowed:
        raise invalid(name, f"'{name}' must be one of {', '.join(allowed)}")
    return v


def parse(body: dict[str, Any]) -> EmbedBody:
    """A body as an `Embed` request, or a 400 naming the field."""
    fields.check("embeddings", body)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid("model", "'model' must be a string")
    if "input" not in body:
        raise invalid("input", "'input' is required")
    inputs = read_inputs(body["input"])
    msg = pb.EmbedRequest(model=model or "")
    for one in inputs:
        if isinstance(one, str):
            msg.inputs.add(text=one)
        else:
            msg.inputs.add().tokens.ids.extend(one)
    dimensions = _int(body, "dimensions", 1)
    if dimensions is not None:
        msg.dimensions = dimensions
    truncate = _int(body, "truncate_prompt_tokens", -1)
    if truncate is not None and truncate != 0:
        msg.truncate_prompt_tokens = UINT32_MAX if truncate == -1 else truncate  # -1: context
    elif truncate == 0:
        raise invalid("truncate_prompt_tokens", "'truncate_prompt_tokens' must be -1 or above 0")
    msg.truncate_left = _choice(body, "truncation_side", ("right", "left")) == "left"
    activation = body.get("use_activation")
    if activation is not None:
        if not isinstance(activation, bool):
            raise invalid("use_activation", "'use_activation' must be a boolean")
        msg.normalize = activation
    encoding = _choice(body, "encoding_format", ("float", "base64"))
    tier = body.get("service_tier")
    if tier is not None and not isinstance(tier, str):
        raise invalid("service_tier", "'service_tier' must be a string")
    priority.check_tier(tier)
    chars = sum(len(one) if isinstance(one, str) else 4 * len(one) for one in inputs)
    return EmbedBody(msg, encoding == "base64", tier, chars // 4 + len(inputs))


def encode(values: Any, as_base64: bool) -> Any:
    """A vector as OpenAI writes it: floats, or base64 of little-endian float32 (what the
    SDK decodes with numpy, and vLLM's server sends)."""
    if not as_base64:
        return list(values)
    floats = array.array("f", values)
    if sys.byteorder == "big":
        floats.byteswap()
    return base64.b64encode(floats.tobytes()).decode()


async def embeddings(state: EdgeState, request: Request) -> Response:
    """POST /v1/embeddings."""
    cfg = state.config
    parsed = parse((await read_json(state, request))[0])
    rec = record_of(request.scope)
    msg = parsed.request
    asked = request.headers.get(priority.HEADER)
    msg.priority, msg.tenant = state.priorities.of(asked, parsed.service_tier, rec.caller)
    rec.model = msg.model
    if rec.reserve is not None:  # a tokens-per-minute limit: 429 here, before any worker
        await rec.reserve(parsed.cost)
    msg.request_id = rec.request_id = new_request_id()
    rec.trace_id = trace_id(request, msg.request_id)
    timeout = timeout_s(request, False, cfg.stream.request_timeout_s)
    worker, reply = await _call(state, msg, timeout, rec.trace_id)
    model = msg.model or worker.model_id()
    rec.model, rec.worker = model, worker.key
    rec.prompt_tokens, rec.completion_tokens = reply.usage.prompt_tokens, 0
    rec.generation = msg.request_id  # the usage ledger counts it once
    data = [
        {"object": "embedding", "index": i, "embedding": encode(e.values, parsed.base64)}
        for i, e in enumerate(reply.embeddings)
    ]
    tokens = reply.usage.prompt_tokens
    body = {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return ORJSONResponse(body, headers={TRACE_KEY: rec.trace_id})


async def _call(
    state: EdgeState, msg: pb.EmbedRequest, timeout: float, trace: str
) -> tuple[Worker, pb.EmbedResponse]:
    """The reply of the first worker that embeds the batch: up to `--max-tries` workers,
    each once, within `--retry-budget`. Raises ApiError."""
    routing = state.config.routing
    registry = state.workers()
    tried: list[str] = []
    deadline = time.monotonic() + routing.retry_budget_s
    last: ApiError | None = None
    while True:
        try:
            worker = registry.pick(msg.model, exclude=tried, task=pb.TASK_EMBED)
        except ApiError:
            if last is None:
                raise
            raise last from None  # no other worker: the last one's answer
        tried.append(worker.address)
        outcome = CANCELLED  # unless it ends otherwise (the client left)
        try:
            reply = await worker.embed(msg, timeout, ((TRACE_KEY, trace),))
            outcome = OK
            return worker, reply
        except grpc.aio.AioRpcError as err:
            code = err.code()
            state.metrics.upstream_errors[code.name] += 1
            last = from_rpc_error(err)
            outcome = last.code or "upstream_error"
            if outcome in PASSIVE_FAILURES:
                worker.failed()
            if code not in RETRIED or len(tried) >= routing.max_tries:
                raise last from None
            if time.monotonic() >= deadline:
                raise last from None
        finally:
            # The pool's outcomes as a generation's attempts (no TTFT: nothing streams).
            registry.pool_metrics(worker.pool).outcome(outcome, None)
            registry.released(worker)
