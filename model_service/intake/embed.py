"""An `Embed` request as a domain request, its checks, and its inputs as token ids
(tokenized, truncated, fitted to the context): pure but for the engine's tokenizer."""

from __future__ import annotations

from generated import sluice_pb2 as pb
from model_service.config import LimitsConfig
from model_service.engines.base import Engine
from model_service.errors import InvalidArgument, NotFound
from model_service.intake.decode import priority_class
from model_service.intake.validation import validate_ids
from model_service.types import EmbedRequest, GenerationRequest, ModelInfo, SamplingParams

MAX_INPUTS = 2048  # OpenAI's limit on one embeddings request


def embed_request_from_pb(msg: pb.EmbedRequest) -> EmbedRequest:
    """The request with the contract's defaults applied. Raises InvalidArgument."""
    inputs: list[str | list[int]] = []
    for i, item in enumerate(msg.inputs):
        which = item.WhichOneof("input")
        if which == "text":
            inputs.append(item.text)
        elif which == "tokens":
            inputs.append(list(item.tokens.ids))
        else:
            raise InvalidArgument(f"inputs[{i}]", "set one of `text` and `tokens`")
    return EmbedRequest(
        request_id=msg.request_id,
        inputs=inputs,
        model=msg.model,
        dimensions=msg.dimensions if msg.HasField("dimensions") else None,
        normalize=msg.normalize if msg.HasField("normalize") else True,
        truncate=msg.truncate_prompt_tokens or None,
        truncate_left=msg.truncate_left,
        priority=priority_class(msg.priority),
        tenant=msg.tenant,
    )


def validate_embed(req: EmbedRequest, model: ModelInfo, limits: LimitsConfig) -> None:
    """Checks that need no tokenizer. Raises InvalidArgument / NotFound."""
    validate_ids(req.request_id, req.tenant, limits)
    if req.model and req.model != model.id:
        raise NotFound(
            f"model {req.model[:200]!r} is not served here (serving {model.id!r})", field="model"
        )
    if model.task != "embed":
        raise InvalidArgument(
            "model", f"model {model.id!r} generates: embeddings need a --runner pooling worker"
        )
    if not req.inputs:
        raise InvalidArgument("inputs", "at least one input is required")
    if len(req.inputs) > MAX_INPUTS:
        raise InvalidArgument("inputs", f"more than {MAX_INPUTS} inputs")
    size = 0
    for i, item in enumerate(req.inputs):
        if not item:
            raise InvalidArgument(f"inputs[{i}]", "an input must not be empty")
        if isinstance(item, str):
            size += len(item.encode())
        elif model.vocab_size and max(item) >= model.vocab_size:
            bad = next(t for t in item if t >= model.vocab_size)
            vocab = model.vocab_size
            raise InvalidArgument(
                f"inputs[{i}]", f"token id {bad} is outside the model's vocabulary of {vocab}"
            )
    if size > limits.max_prompt_bytes:
        raise InvalidArgument("inputs", f"the texts exceed {limits.max_prompt_bytes} bytes")
    if req.dimensions is not None:
        if not model.matryoshka:
            raise InvalidArgument(
                "dimensions", f"model {model.id!r} has no Matryoshka embeddings: leave it unset"
            )
        if not 1 <= req.dimensions <= model.embedding_size:
            raise InvalidArgument(
                "dimensions", f"must be within [1, {model.embedding_size}], got {req.dimensions}"
            )


async def token_ids(req: EmbedRequest, engine: Engine, model: ModelInfo) -> list[list[int]]:
    """Each input's token ids: texts tokenized as a raw prompt is, then truncated (the
    first tokens kept, the last with `truncate_left`), then fitted to the context."""
    out = []
    limit = model.max_model_len
    for i, item in enumerate(req.inputs):
        if isinstance(item, str):
            one = GenerationRequest(f"{req.request_id}/{i}", SamplingParams())
            one.prompt = item
            ids = await engine.tokenize(one)
        else:
            ids = item
        if req.truncate is not None and len(ids) > min(req.truncate, limit):
            keep = min(req.truncate, limit)
            ids = ids[-keep:] if req.truncate_left else ids[:keep]
        if not ids:
            raise InvalidArgument(f"inputs[{i}]", "the input is no tokens once tokenized")
        if len(ids) > limit:
            raise InvalidArgument(
                f"inputs[{i}]",
                f"the input is {len(ids)} tokens, over the model's context window of "
                f"{limit} tokens (truncate_prompt_tokens cuts it)",
            )
        out.append(ids)
    return out
