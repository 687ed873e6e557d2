"""OpenAI chunks and whole responses of the two endpoints: chat (`ChatFormat`) and
completions (`CompletionFormat`, the legacy logprobs layout, vLLM's `echo`), on the
shared base `edge.api.chunks.ChunkFormat`."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import orjson

from edge.api.choices import logprob_entries, tool_call_delta
from edge.api.chunks import ChunkFormat
from edge.api.prompt_logprobs import echo_entries
from edge.api.schema import GenRequest, Kind
from edge.stream.job import Event
from generated import sluice_pb2 as pb

_dumps = orjson.dumps

__all__ = ["ChatFormat", "ChunkFormat", "CompletionFormat", "logprob_entries", "make_format"]


class ChatFormat(ChunkFormat):
    """`chat.completion.chunk` objects; the role goes in the first delta. `role` and
    `echo` (vLLM's chat `echo`: text before the reply, one chunk per choice after the
    role's) are set by the caller."""

    object_name = "chat.completion.chunk"
    response_object = "chat.completion"

    def __init__(
        self, response_id: str, model: str, created: int, include_usage: bool, n: int = 1
    ) -> None:
        super().__init__(response_id, model, created, include_usage, n)
        self._delta_head = self._head + b'[{"index":0,"delta":{"content":'
        self._null_end = b',"finish_reason":null}]' + self._tail
        self.role = "assistant"
        self.echo = ""

    def opening(self) -> bytes:
        return (
            self._head
            + b'[{"index":0,"delta":{"role":'
            + _dumps(self.role)
            + b',"content":""},"logprobs":null'
            + self._null_end
        )

    def opening_events(self, seq: int) -> list[Event]:
        out = super().opening_events(seq)
        if self.echo:
            out += [
                (None, self._chunk(self._echo_choice(c), self.opening_usage(c)))
                for c in range(self.n)
            ]
        return out

    def _echo_choice(self, choice: int) -> dict[str, Any]:
        delta = {"content": self.echo}
        return {"index": choice, "delta": delta, "logprobs": None, "finish_reason": None}

    def _open_choice(self, choice: int) -> dict[str, Any] | None:
        delta = {"role": self.role, "content": ""}
        return {"index": choice, "delta": delta, "logprobs": None, "finish_reason": None}

    def delta(self, text: str, logprobs: list[dict[str, Any]] | None) -> bytes:
        lp = b"null" if logprobs is None else b'{"content":' + _dumps(logprobs) + b"}"
        return self._delta_head + _dumps(text) + b'},"logprobs":' + lp + self._null_end

    def _choice_delta(self, chunk: pb.TokenChunk, logprobs: Any) -> dict[str, Any] | None:
        delta: dict[str, Any] = {}
        if chunk.reasoning:  # the model's thinking, as vLLM's reasoning parsers split it
            delta["reasoning_content"] = chunk.reasoning
        if chunk.text:
            delta["content"] = chunk.text
        if chunk.tool_calls:
            delta["tool_calls"] = [tool_call_delta(t) for t in chunk.tool_calls]
        ids = self.token_ids and chunk.token_ids
        if not delta and logprobs is None and not ids:
            return None
        out: dict[str, Any] = {"delta": delta}
        out["logprobs"] = None if logprobs is None else {"content": logprobs}
        if self.token_ids:
            out["token_ids"] = list(chunk.token_ids)
        return out

    def _finish_choice(self, choice: int, reason: str) -> dict[str, Any]:
        out: dict[str, Any] = {"index": choice, "delta": {}, "logprobs": None}
        out["finish_reason"] = reason
        if self.token_ids:
            out["token_ids"] = []
        return out

    def finish(self, reason: str) -> bytes:
        return (
            self._head
            + b'[{"index":0,"delta":{},"logprobs":null,"finish_reason":'
            + _dumps(reason)
            + b"}]"
            + self._tail
        )

    def choice(
        self,
        text: str,
        logprobs: list[dict[str, Any]] | None,
        calls: list[dict[str, Any]],
        index: int = 0,
    ) -> dict[str, Any]:
        text = self.echo + text
        message: dict[str, Any] = {"role": self.role, "content": text}
        if calls:
            message["content"] = text or None
            message["tool_calls"] = calls
        return {"message": message, "logprobs": None if logprobs is None else {"content": logprobs}}


class CompletionFormat(ChunkFormat):
    """`text_completion` objects with the legacy logprobs layout. `echo` (set by the
    caller: the prompt, vLLM's `echo`) goes before each choice's text, the prompt's
    logprobs before its tokens' (streamed: a chunk per choice opening the stream)."""

    object_name = "text_completion"
    response_object = "text_completion"
    prompt_top = False

    def __init__(
        self, response_id: str, model: str, created: int, include_usage: bool, n: int = 1
    ) -> None:
        super().__init__(response_id, model, created, include_usage, n)
        self._text_head = self._head + b'[{"index":0,"text":'
        self._offsets: defaultdict[int, int] = defaultdict(int)  # per choice, text_offset
        # Each prompt's text (set by the caller); empty: the worker's (`prompt_text`).
        self.echo: list[str] | None = None
        self.echo_logprobs = False  # with `logprobs`: the prompt's first (set by the caller)
        self.prompt_only = False  # `max_tokens` 0: the echo alone (set by the caller)

    def opening_events(self, seq: int) -> list[Event]:
        """With `echo`, a chunk per choice holding the prompt (and its logprobs) opens the
        stream, so that a resume after it never sends it twice."""
        out = super().opening_events(seq)
        if self.echo is not None:
            out += [
                (None, self._chunk(self._echo_choice(c), self.opening_usage(c)))
                for c in range(self.n)
            ]
        return out

    def _echo_choice(self, choice: int) -> dict[str, Any]:
        lps = self._echo_logprobs(choice)
        legacy = None if lps is None else self._legacy_logprobs(lps, choice)
        text = self._echo_text(choice)
        out: dict[str, Any] = {"index": choice, "text": text, "logprobs": legacy}
        out["finish_reason"] = None
        if (ids := self._prompt_ids_once(choice)) is not None:
            out["prompt_token_ids"] = ids
        return out

    def _echo_text(self, choice: int) -> str:
        p = choice // self.per_prompt
        return self.echo[p] if self.echo else self.prompt_texts.get(p, "")

    def _echo_logprobs(self, choice: int) -> list[dict[str, Any]] | None:
        if not self.echo_logprobs:
            return None
        return echo_entries(self.prompt_lps.get(choice // self.per_prompt, []))

    def _legacy_logprobs(self, entries: list[dict[str, Any]], choice: int = 0) -> dict[str, Any]:
        offsets = []
        for e in entries:
            offsets.append(self._offsets[choice])
            self._offsets[choice] += len(e["token"])
        return {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [_legacy_top(e) for e in entries],
            "text_offset": offsets,
        }

    def delta(self, text: str, logprobs: list[dict[str, Any]] | None) -> bytes:
        lp = b"null" if logprobs is None else _dumps(self._legacy_logprobs(logprobs))
        return (
            self._text_head
            + _dumps(text)
            + b',"logprobs":'
            + lp
            + b',"finish_reason":null}]'
            + self._tail
        )

    def finish(self, reason: str) -> bytes:
        return (
            self._text_head
            + b'"","logprobs":null,"finish_reason":'
            + _dumps(reason)
            + b"}]"
            + self._tail
        )

    def _choice_delta(self, chunk: pb.TokenChunk, logprobs: Any) -> dict[str, Any] | None:
        if self.prompt_only:
            return None
        if not chunk.text and logprobs is None and not (self.token_ids and chunk.token_ids):
            return None
        legacy = None if logprobs is None else self._legacy_logprobs(logprobs, chunk.choice)
        out: dict[str, Any] = {"text": chunk.text, "logprobs": legacy}
        if self.token_ids:
            ids = self._prompt_ids_once(chunk.choice)
            if ids is not None:  # vLLM's: on each choice's first chunk
                out["prompt_token_ids"] = ids
            out["token_ids"] = list(chunk.token_ids)
        return out

    def _finish_choice(self, choice: int, reason: str) -> dict[str, Any]:
        out: dict[str, Any] = {"index": choice, "text": "", "logprobs": None}
        out["finish_reason"] = reason
        if self.token_ids:
            out["token_ids"] = []
        return out

    def choice(
        self,
        text: str,
        logprobs: list[dict[str, Any]] | None,
        calls: list[dict[str, Any]],
        index: int = 0,
    ) -> dict[str, Any]:
        self._offsets[0] = 0
        if self.prompt_only:  # vLLM's: the generated token is counted, not shown
            text, logprobs = "", None if logprobs is None else []
        if self.echo is not None:  # vLLM's: the prompt, then the text
            text = self._echo_text(index) + text
            if logprobs is not None:
                logprobs = (self._echo_logprobs(index) or []) + logprobs
        legacy = None if logprobs is None else self._legacy_logprobs(logprobs)
        return {"text": text, "logprobs": legacy}


def _legacy_top(entry: dict[str, Any]) -> dict[str, float] | None:
    """vLLM's legacy `top_logprobs` of a token: the token itself, then its alternatives."""
    top = entry["top_logprobs"]
    if top is None:
        return None
    return {entry["token"]: entry["logprob"]} | {t["token"]: t["logprob"] for t in top}


def make_format(
    kind: Kind, request_id: str, model: str, created: int, include_usage: bool, n: int = 1
) -> ChunkFormat:
    """The renderer for an endpoint; ids follow OpenAI's prefixes."""
    if kind == "chat":
        return ChatFormat(f"chatcmpl-{request_id}", model, created, include_usage, n)
    return CompletionFormat(f"cmpl-{request_id}", model, created, include_usage, n)


def format_for(
    kind: Kind, request_id: str, model: str, created: int, req: GenRequest
) -> ChunkFormat:
    """The renderer of a chat or completions request, set up for what it asks (a batch's
    choices, vLLM's token ids, prompt text and logprobs, echo)."""
    batch = len(req.batch) if req.batch else 1
    fmt = make_format(kind, request_id, model, created, req.include_usage, req.n * batch)
    fmt.per_prompt = req.n
    fmt.continuous_usage = req.continuous_usage
    fmt.token_ids = req.return_token_ids
    fmt.prompt_text = req.return_prompt_text
    fmt.prompt_first = req.return_token_ids or req.return_prompt_text or req.continuous_usage
    fmt.show_prompt_logprobs = req.show_prompt_logprobs
    if isinstance(fmt, ChatFormat):
        fmt.role, fmt.echo = req.role, req.echo_text
    elif isinstance(fmt, CompletionFormat) and req.echo_prompt:
        fmt.echo = [p for p in req.prompts() if isinstance(p, str)]
        fmt.echo_logprobs = req.logprobs is not None
        fmt.prompt_only = req.prompt_only
        fmt.prompt_first = fmt.prompt_first or fmt.echo_logprobs or req.echo_decoded
    return fmt
