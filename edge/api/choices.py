"""The pieces of one choice shared by the chat and completions formats: usage, logprob
entries, tool-call deltas, and a whole choice gathered from its chunks (`Collected`)."""

from __future__ import annotations

from typing import Any

import orjson

from edge.stream.job import FINISH_REASONS
from generated import sluice_pb2 as pb


def usage_dict(u: pb.Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_prompt_tokens},
    }


def _token(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def tool_call_delta(t: pb.ToolCallDelta) -> dict[str, Any]:
    """A streamed tool call part as OpenAI's `delta.tool_calls[]` entry."""
    if t.id:
        return {
            "index": t.index,
            "id": t.id,
            "type": "function",
            "function": {"name": t.name, "arguments": t.arguments},
        }
    return {"index": t.index, "function": {"arguments": t.arguments}}


class Collected:
    """One choice of a whole (non-streamed) response, gathered from its chunks."""

    __slots__ = ("calls", "ids", "logprobs", "reasoning", "texts")

    def __init__(self, logprobs: bool) -> None:
        self.texts: list[str] = []
        self.reasoning: list[str] = []  # the model's thinking (a worker's reasoning parser)
        self.ids: list[int] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.logprobs: list[dict[str, Any]] | None = [] if logprobs else None

    def add(self, chunk: pb.TokenChunk, logprobs: list[dict[str, Any]] | None) -> None:
        self.texts.append(chunk.text)
        if chunk.reasoning:
            self.reasoning.append(chunk.reasoning)
        self.ids.extend(chunk.token_ids)
        if logprobs is not None and self.logprobs is not None:
            self.logprobs.extend(logprobs)
        for t in chunk.tool_calls:
            call = self.calls.get(t.index)
            if call is None:
                fn = {"name": t.name, "arguments": ""}
                call = self.calls[t.index] = {"id": t.id, "type": "function", "function": fn}
            call["function"]["arguments"] += t.arguments

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def tool_calls(self, reason: str = "stop") -> list[dict[str, Any]]:
        """The calls, in order; cut by `max_tokens` (`reason` length), only those whose
        arguments are a whole JSON object (as OpenAI and vLLM: no call for a cut one)."""
        calls = [self.calls[i] for i in sorted(self.calls)]
        if reason == "length":
            calls = [c for c in calls if _whole_object(c["function"]["arguments"])]
        return calls


def _whole_object(text: str) -> bool:
    try:
        return isinstance(orjson.loads(text), dict)
    except orjson.JSONDecodeError:
        return False


def choice_reasons(final: pb.Final) -> dict[int, str]:
    """The finish reason of every choice: from `final.choices` (n > 1) or the final's own."""
    if not final.choices:
        return {0: FINISH_REASONS[final.reason]}
    return {i: FINISH_REASONS.get(end.reason, "stop") for i, end in enumerate(final.choices)}


def logprob_entries(chunk: pb.TokenChunk) -> list[dict[str, Any]]:
    """Chat-style logprob entries of a chunk, one per token."""
    out = []
    for lp in chunk.logprobs:
        entry = _token(lp.text, lp.logprob)
        entry["top_logprobs"] = [_token(t.text, t.logprob) for t in lp.top]
        out.append(entry)
    return out
