"""A prompt's tokens without generating. vLLM's render endpoints
(`/v1/chat/completions/render`, `/v1/completions/render`): its token ids, answered as
vLLM's server does, so token-aware routers (vllm-router's `cache_aware`) can put edges
behind them; Anthropic's `/v1/messages/count_tokens`: their number. A worker's `Tokenize`
makes them (template included): exactly what a generation would prefill."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from edge.api import bodies
from edge.api.generate import new_request_id, read_body
from edge.api.messages import parse_messages
from edge.api.pages import ORJSONResponse
from edge.api.schema import GenRequest, Kind
from edge.api.sizes import check_sizes
from edge.api.state import EdgeState
from edge.api.tokens import tokenize_request
from generated import sluice_pb2 as pb

if TYPE_CHECKING:
    from edge.config import SecurityConfig


async def render(state: EdgeState, request: Request, kind: Kind) -> Response:
    cfg = state.config
    raw = await read_body(request, cfg.server.max_body_bytes)
    req = await bodies.parse(kind, await bodies.decode(raw), len(raw), cfg.security)
    worker = state.workers().pick(req.model)
    if req.messages is not None:
        ids = await worker.tokenize(tokenize_request(req))
        return ORJSONResponse({"request_id": new_request_id(), "token_ids": ids})
    out = []  # one per prompt of a batch, as vLLM's
    for prompt in req.prompts():
        if isinstance(prompt, str):
            prompt = await worker.tokenize(pb.TokenizeRequest(model=req.model, prompt=prompt))
        out.append({"request_id": new_request_id(), "token_ids": prompt})  # ids: as given
    return ORJSONResponse(out)


async def count_tokens(state: EdgeState, request: Request) -> Response:
    """POST /v1/messages/count_tokens: `{"input_tokens": N}` for a Messages body."""
    cfg = state.config
    raw = await read_body(request, cfg.server.max_body_bytes)
    req = await bodies.run(len(raw), _counted, await bodies.decode(raw), cfg.security)
    ids = await state.workers().pick(req.model).tokenize(tokenize_request(req))
    return ORJSONResponse({"input_tokens": len(ids)})


def _counted(body: dict[str, object], limits: SecurityConfig) -> GenRequest:
    req = parse_messages(body, count=True)
    check_sizes(req, body, limits)
    return req
