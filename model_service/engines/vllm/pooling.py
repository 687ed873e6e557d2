"""Embeddings on a pooling worker (`--runner pooling`: vLLM converts a decoder model to an
embedding model, its pooler taking the last token's hidden state): one `AsyncLLM.encode`
request per input, all at once so the scheduler batches them, with the `PoolingParams`
vLLM's own embeddings endpoint sends (task embed, dimensions, normalization)."""

from __future__ import annotations

import asyncio
from typing import Any

from model_service.errors import EngineDead, EngineError, InvalidArgument
from model_service.types import EmbedRequest


async def embed(llm: Any, request: EmbedRequest, ids: list[list[int]]) -> list[list[float]]:
    """Each input's vector, in order. Raises InvalidArgument, EngineDead or EngineError."""
    from vllm import PoolingParams
    from vllm.exceptions import VLLMClientError
    from vllm.inputs import tokens_input
    from vllm.v1.engine.exceptions import EngineDeadError

    params = PoolingParams(
        task="embed", dimensions=request.dimensions, use_activation=request.normalize
    )
    try:
        params.verify(llm.model_config)  # the model's defaults, its Matryoshka bounds
    except (ValueError, VLLMClientError) as exc:
        raise InvalidArgument("dimensions", str(exc)) from exc

    async def one(i: int, prompt: list[int]) -> list[float]:
        last = None
        async for out in llm.encode(
            tokens_input(prompt),
            params.clone(),
            f"{request.request_id}/{i}",
            priority=request.priority,
        ):
            last = out
        if last is None or getattr(last, "error", None) is not None:
            raise EngineError(f"the engine failed input {i}")
        return list(last.outputs.data.tolist())

    tasks = [asyncio.ensure_future(one(i, p)) for i, p in enumerate(ids)]
    try:
        return list(await asyncio.gather(*tasks))
    except EngineDeadError as exc:
        raise EngineDead("the vLLM engine died") from exc
    except (ValueError, VLLMClientError) as exc:
        raise InvalidArgument("inputs", str(exc)) from exc
    finally:
        for t in tasks:  # one failed or the caller left: the others abort (encode's own)
            t.cancel()
