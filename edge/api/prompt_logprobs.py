"""vLLM's prompt log-probabilities on chat and completions: what a body asks for
(`prompt_logprobs`; completions `echo` with `logprobs`; chat `echo`), and how an answer
lays them out: vLLM's `prompt_logprobs` list (null for the first token, then per token a
map of token id -> logprob, rank, decoded token), and echo's legacy entries."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from edge.errors import invalid
from generated import sluice_pb2 as pb

if TYPE_CHECKING:
    from edge.api.schema import GenRequest

MAX_PROMPT_LOGPROBS = 20  # vLLM's default max_logprobs; the contract's limit
FLOOR = -9999.0  # vLLM's (and OpenAI's) stand-in for -inf in JSON


def read(body: dict[str, Any], stream: bool) -> int | None:
    """`prompt_logprobs` as vLLM checks it: an integer, at most 20 (-1, the whole
    vocabulary, is more), not above 0 on a stream (vLLM's 400: streamed chunks carry
    none)."""
    v = body.get("prompt_logprobs")
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise invalid("prompt_logprobs", "`prompt_logprobs` must be an integer.")
    if stream and (v > 0 or v == -1):
        raise invalid("prompt_logprobs", "`prompt_logprobs` are not available when `stream=True`.")
    if v == -1:
        raise invalid(
            "prompt_logprobs",
            "`prompt_logprobs` of -1 (the whole vocabulary) is more than this server's "
            f"most, {MAX_PROMPT_LOGPROBS}",
        )
    if v < 0:
        raise invalid("prompt_logprobs", "`prompt_logprobs` must be a positive value or -1.")
    if v > MAX_PROMPT_LOGPROBS:
        raise invalid(
            "prompt_logprobs",
            f"`prompt_logprobs` must be at most {MAX_PROMPT_LOGPROBS}, got {v}",
        )
    return v


def ask(body: dict[str, Any], req: GenRequest, echo_k: int | None, echoed: bool = False) -> None:
    """Set what `req` asks of the worker and shows: the body's `prompt_logprobs`, else
    `echo_k` (vLLM's: an `echo` asks for them too); a stream shows none (as vLLM's), but
    completions echo with logprobs (`echoed`) lays the prompt's out all the same."""
    k = read(body, req.stream)
    if k is None:
        k = echo_k
    req.show_prompt_logprobs = k is not None and not req.stream
    req.prompt_logprobs = k if req.show_prompt_logprobs or echoed else None


def _clamp(lp: float) -> float:
    return lp if lp > FLOOR else FLOOR


def vllm_layout(lps: Sequence[pb.TokenLogprob]) -> list[dict[str, Any] | None]:
    """vLLM's `prompt_logprobs`: None for the first token, then for each token its own
    entry first and its top alternatives (rank order), keyed by token id."""
    out: list[dict[str, Any] | None] = [None] if lps else []
    for lp in lps[1:]:
        entry = {str(lp.token_id): _entry(lp.logprob, lp.rank or None, lp.text)}
        for rank, t in enumerate(lp.top, 1):
            entry.setdefault(str(t.token_id), _entry(t.logprob, rank, t.text))
        out.append(entry)
    return out


def _entry(logprob: float, rank: int | None, text: str) -> dict[str, Any]:
    return {"logprob": _clamp(logprob), "rank": rank, "decoded_token": text}


def echo_entries(lps: Sequence[pb.TokenLogprob]) -> list[dict[str, Any]]:
    """The prompt's tokens as the chat-style entries the completions format turns into
    its legacy layout (`edge.api.choices.logprob_entries`); the first has no logprob."""
    out: list[dict[str, Any]] = []
    for i, lp in enumerate(lps):
        if i == 0:
            out.append({"token": lp.text, "logprob": None, "top_logprobs": None})
            continue
        top = [{"token": t.text, "logprob": _clamp(t.logprob)} for t in lp.top]
        out.append({"token": lp.text, "logprob": _clamp(lp.logprob), "top_logprobs": top})
    return out
