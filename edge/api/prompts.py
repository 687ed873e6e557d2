"""The `/v1/completions` prompt's forms, as OpenAI and vLLM take them: a string, token
ids, or a batch of either (a list of strings, a list of token-id lists). A batch is
served as one generation per prompt, its choices numbered prompt by prompt."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edge.errors import invalid
from edge.routing.prefix import Prompt as Routed
from edge.upstream.batch import BatchCall
from edge.upstream.calls import UpstreamCall
from generated import sluice_pb2 as pb

UINT32_MAX = 2**32 - 1
MAX_BATCH = 64  # prompts in one request (each is a generation of its own)

Prompt = str | list[int]


def _is_token_id(v: Any) -> bool:
    return type(v) is int and 0 <= v <= UINT32_MAX


def _ids(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(_is_token_id(i) for i in v)


def read(body: dict[str, Any]) -> list[Prompt]:
    """The prompts of a body, in order (one unless a batch), or a 400 naming `prompt`."""
    prompt = body.get("prompt")
    if prompt is None:
        raise invalid("prompt", "'prompt' is required")
    if isinstance(prompt, str) or _ids(prompt):
        batch = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        batch = prompt
    elif isinstance(prompt, list) and prompt and all(_ids(p) for p in prompt):
        batch = prompt
    else:
        raise invalid(
            "prompt",
            "'prompt' must be a string, a non-empty list of token ids (integers from 0 to "
            f"{UINT32_MAX}), or a batch: a list of strings or a list of token-id lists",
        )
    if len(batch) > MAX_BATCH:
        raise invalid(
            "prompt", f"'prompt' is a batch of {len(batch)} prompts, more than {MAX_BATCH}"
        )
    for i, p in enumerate(batch):
        if p == "":
            where = "prompt" if len(batch) == 1 else f"prompt[{i}]"
            raise invalid(where, f"'{where}' must not be empty")
    return batch


def start_for(start: pb.StartGeneration, i: int, prompt: Prompt) -> pb.StartGeneration:
    """The generation of a batch's prompt `i`: the request's start with that prompt and
    an id of its own."""
    one = pb.StartGeneration()
    one.CopyFrom(start)
    one.request_id = f"{start.request_id}b{i}"
    if isinstance(prompt, str):
        one.prompt = prompt
    else:
        one.ClearField("prompt_tokens")
        one.prompt_tokens.ids.extend(prompt)
    return one


def routed(prompt: Prompt) -> str:
    """A prompt as routing hashes it (token ids as text: a shared id prefix is a shared
    prefix)."""
    return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))


def batch_call(
    start: pb.StartGeneration,
    batch: list[Prompt],
    n: int,
    call: Callable[[pb.StartGeneration, Routed], UpstreamCall],
) -> BatchCall:
    """A batch's generations (`call` makes each one's, routed by its own prompt) as one
    `BatchCall`, each generation's prompt message first when the start asks for one."""
    calls = [call(start_for(start, i, p), Routed(None, routed(p))) for i, p in enumerate(batch)]
    asks = start.return_prompt_tokens or start.return_prompt_text or start.stream_usage
    asks = asks or start.sampling.HasField("prompt_logprobs")
    return BatchCall(calls, n, prompt_messages=asks)
