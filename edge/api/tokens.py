"""A request's prompt as token ids, from a worker's `Tokenize` (the edge has no tokenizer;
the chat template is applied exactly as the generation's prefill will be): for the render
endpoints, and for `kv_aware` routing, which hashes them as the engine names its blocks."""

from __future__ import annotations

from edge.api.schema import GenRequest
from edge.errors import ApiError
from edge.routing.registry import PoolRegistry
from generated import sluice_pb2 as pb


def tokenize_request(req: GenRequest) -> pb.TokenizeRequest:
    """What to ask a worker for (a chat, or the prompt text)."""
    request = pb.TokenizeRequest(model=req.model)
    if req.messages is not None:
        request.chat.CopyFrom(req.chat_input())
    else:
        request.prompt = req.prompt or ""
    return request


async def routing_ids(registry: PoolRegistry, req: GenRequest) -> list[int] | None:
    """The ids `kv_aware` hashes: given ones, else a worker's `Tokenize`. None when no
    worker could say (routing falls back to `cache_aware`); a request the worker refuses
    is refused here, as its generation would be."""
    if req.prompt_tokens is not None:
        return list(req.prompt_tokens)
    try:
        return await registry.pick(req.model).tokenize(tokenize_request(req))
    except ApiError as err:
        if err.status >= 500:
            return None
        raise
