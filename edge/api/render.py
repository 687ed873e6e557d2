"""vLLM's render endpoints: the token ids a request's prompt becomes, without generating.

`POST /v1/chat/completions/render` and `POST /v1/completions/render` take the body of the
matching generation endpoint (validated the same way) and answer as vLLM's own server
does: a `GenerateRequest` (`request_id`, `token_ids`), a list of one for completions.
Token-aware routers in front of edges need them: vllm-router's `cache_aware` policy
renders each request on a backend to route on its tokens, and without these endpoints it
falls back to load alone. The tokens come from a worker serving the model (`Tokenize`,
chat template included), so they are exactly what a generation would prefill.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from edge.api.generate import new_request_id, read_body
from edge.api.pages import ORJSONResponse
from edge.api.schema import Kind, check_prompt, decode_body, parse_chat, parse_completion
from edge.api.state import EdgeState
from generated import sluice_pb2 as pb


async def render(state: EdgeState, request: Request, kind: Kind) -> Response:
    cfg = state.config
    body = decode_body(await read_body(request, cfg.server.max_body_bytes))
    req = parse_chat(body) if kind == "chat" else parse_completion(body)
    check_prompt(req, cfg.security.max_prompt_chars)
    tokenize = pb.TokenizeRequest(model=req.model)
    if req.messages is not None:
        tokenize.chat.messages.extend(req.messages)
        tokenize.chat.tools.extend(req.tools)
    else:
        tokenize.prompt = req.prompt or ""
    worker = state.workers().pick(req.model)
    ids = await worker.tokenize(tokenize)
    out = {"request_id": new_request_id(), "token_ids": ids}
    return ORJSONResponse(out if kind == "chat" else [out])
