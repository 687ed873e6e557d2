"""OpenAI chunks and whole responses. Per token the fast path is one `orjson.dumps(text)`
between a prefix and a suffix made once per stream; the rich shapes (n > 1, tool calls,
usage in every chunk) build each chunk as an object (`events`; `Job.rich`)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import orjson

from edge.api.choices import (
    Collected,
    choice_reasons,
    logprob_entries,
    tool_call_delta,
    usage_dict,
)
from edge.api.schema import Kind
from edge.stream.job import FINISH_REASONS, Event
from generated import sluice_pb2 as pb

_dumps = orjson.dumps


class ChunkFormat:
    """Renders one stream's OpenAI chunks (`edge.stream.job.Format`); subclasses fix
    the object layout."""

    object_name = ""  # of streamed chunks
    response_object = ""  # of a whole response
    logprobs = staticmethod(logprob_entries)

    replay_from_start = False  # resumes pick up at the event's own message (cursor)
    prompt_top = True  # vLLM's `prompt_token_ids`: on the response (chat), or each choice

    def __init__(
        self, response_id: str, model: str, created: int, include_usage: bool, n: int = 1
    ) -> None:
        self.response_id = response_id
        self.model = model
        self.created = created
        self.include_usage = include_usage
        self.continuous_usage = False  # usage in every chunk (set by the caller)
        self.n = n
        # vLLM's `return_token_ids` (set by the caller; its chunks are built as objects):
        # the prompt's ids once (the worker's first message), each chunk's own ids.
        self.token_ids = False
        self.prompt_ids: list[int] | None = None
        self._prompt_sent: set[int] = set()  # of choices (-1: the response's own)
        self._collected: dict[int, Collected] = {}
        self._obj = {
            "id": response_id,
            "object": self.object_name,
            "created": created,
            "model": model,
            "system_fingerprint": None,
        }
        self._head = (
            b'{"id":'
            + _dumps(response_id)
            + b',"object":'
            + _dumps(self.object_name)
            + b',"created":'
            + str(created).encode()
            + b',"model":'
            + _dumps(model)
            + b',"system_fingerprint":null,"choices":'
        )
        # OpenAI sends "usage": null on every chunk when usage was asked for.
        self._tail = b',"usage":null}' if include_usage else b"}"

    def opening(self) -> bytes | None:
        """A chunk to send as soon as the stream starts, if the format has one."""
        return None

    @property
    def prompt_first(self) -> bool:
        """Whether the stream reads the worker's first message (the prompt's token ids)
        before its opening event."""
        return self.token_ids

    def note_prompt(self, chunk: pb.TokenChunk) -> None:
        """Keep the prompt's token ids from the message that carries them (the first)."""
        if chunk.prompt_token_ids and self.prompt_ids is None:
            self.prompt_ids = list(chunk.prompt_token_ids)

    def _prompt_ids_once(self, key: int) -> list[int] | None:
        """The prompt's ids the first time `key` (a choice, -1 the response) asks."""
        if not self.token_ids or self.prompt_ids is None or key in self._prompt_sent:
            return None
        self._prompt_sent.add(key)
        return self.prompt_ids

    def opening_events(self, seq: int) -> list[Event]:
        """The event that opens a stream, if the format has one: with n > 1 one chunk
        holding every choice's opening (one event, so one id to resume after)."""
        if self.n == 1 and not self.token_ids:
            first = self.opening()
            return [] if first is None else [(None, first)]
        choices = [self._open_choice(c) for c in range(self.n)]
        return [(None, self._chunk_of(choices, None))] if choices[0] is not None else []

    def _open_choice(self, choice: int) -> dict[str, Any] | None:
        return None

    def _choice_delta(self, chunk: pb.TokenChunk, logprobs: Any) -> dict[str, Any] | None:
        """The content fields of a rich chunk's choice (None: nothing to send)."""
        raise NotImplementedError

    def _chunk(self, choice: dict[str, Any], usage: pb.Usage | None) -> bytes:
        return self._chunk_of([choice], usage)

    def _chunk_of(self, choices: list[Any], usage: pb.Usage | None) -> bytes:
        obj = {**self._obj, "choices": choices}
        if self.prompt_top and (ids := self._prompt_ids_once(-1)) is not None:
            obj["prompt_token_ids"] = ids
        if usage is not None:
            obj["usage"] = usage_dict(usage)
        elif self.include_usage:
            obj["usage"] = None
        return _dumps(obj)

    def events(self, chunk: pb.TokenChunk, logprobs: Any, seq: int) -> list[Event]:
        """A chunk of any shape (choice, tool calls, usage, a choice's end) as events."""
        usage = chunk.usage if chunk.HasField("usage") else None
        if self.token_ids:
            self.note_prompt(chunk)
        out: list[Event] = []
        fields = self._choice_delta(chunk, logprobs)
        if fields is not None:
            choice = {"index": chunk.choice, **fields, "finish_reason": None}
            out.append((None, self._chunk(choice, usage)))
        if chunk.HasField("choice_end"):
            reason = FINISH_REASONS.get(chunk.choice_end.reason, "stop")
            out.append((None, self._chunk(self._finish_choice(chunk.choice, reason), usage)))
        return out

    def _finish_choice(self, choice: int, reason: str) -> dict[str, Any]:
        raise NotImplementedError

    def ending(self, final: pb.Final, seq: int) -> list[Event]:
        """Every event after the last token: the finish (n = 1: choices ended on the way),
        the usage chunk if asked, `[DONE]`."""
        out: list[Event] = []
        if not final.choices:
            reason = FINISH_REASONS[final.reason]
            if self.continuous_usage:  # vLLM's continuous_usage_stats: this chunk too
                out.append((None, self._chunk(self._finish_choice(0, reason), final.usage)))
            else:
                out.append((None, self.finish(reason)))
        if self.include_usage:
            out.append((None, self.usage(final.usage)))
        out.append((None, b"[DONE]"))
        return out

    def collect(self, chunk: pb.TokenChunk, logprobs: list[dict[str, Any]] | None) -> None:
        """Gather a chunk for the whole response."""
        if self.token_ids:
            self.note_prompt(chunk)
        got = self._collected.get(chunk.choice)
        if got is None:
            got = self._collected[chunk.choice] = Collected(logprobs is not None)
        got.add(chunk, logprobs)

    def whole(self, final: pb.Final, logprobs: bool) -> dict[str, Any]:
        """The whole (non-streamed) response from what `collect` gathered."""
        reasons = choice_reasons(final)
        choices = []
        for i in range(max(self.n, len(reasons))):
            got = self._collected.get(i) or Collected(logprobs)
            reason = reasons.get(i, "stop")
            fields = self.choice(got.text, got.logprobs, got.tool_calls(reason))
            if got.reasoning and "message" in fields:  # chat: the thinking beside the answer
                fields["message"]["reasoning_content"] = "".join(got.reasoning)
            choice = {"index": i, **fields, "finish_reason": reason}
            if not self.prompt_top:  # vLLM's fields, null when not asked
                choice["prompt_token_ids"] = self.prompt_ids if self.token_ids else None
            choice["token_ids"] = got.ids if self.token_ids else None
            choices.append(choice)
        out = {**self._obj, "object": self.response_object, "choices": choices,
               "usage": usage_dict(final.usage)}  # fmt: skip
        if self.prompt_top:
            out["prompt_token_ids"] = self.prompt_ids if self.token_ids else None
        return out

    def delta(self, text: str, logprobs: list[dict[str, Any]] | None) -> bytes:
        raise NotImplementedError

    def finish(self, reason: str) -> bytes:
        raise NotImplementedError

    def usage(self, usage: pb.Usage) -> bytes:
        """The extra last chunk of `stream_options.include_usage`: no choices, the usage."""
        return self._head + b'[],"usage":' + _dumps(usage_dict(usage)) + b"}"

    def choice(
        self, text: str, logprobs: list[dict[str, Any]] | None, calls: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """The content fields of one choice of a whole (non-streamed) response."""
        raise NotImplementedError

    def response(
        self, text: str, reason: str, usage: pb.Usage, logprobs: list[dict[str, Any]] | None
    ) -> dict[str, Any]:
        """A whole (non-streamed) response object with one plain choice."""
        choice = {"index": 0, **self.choice(text, logprobs, []), "finish_reason": reason}
        return {**self._obj, "object": self.response_object, "choices": [choice],
                "usage": usage_dict(usage)}  # fmt: skip


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
            out += [(None, self._chunk(self._echo_choice(c), None)) for c in range(self.n)]
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
        self, text: str, logprobs: list[dict[str, Any]] | None, calls: list[dict[str, Any]]
    ) -> dict[str, Any]:
        text = self.echo + text
        message: dict[str, Any] = {"role": self.role, "content": text}
        if calls:
            message["content"] = text or None
            message["tool_calls"] = calls
        return {"message": message, "logprobs": None if logprobs is None else {"content": logprobs}}


class CompletionFormat(ChunkFormat):
    """`text_completion` objects with the legacy logprobs layout."""

    object_name = "text_completion"
    response_object = "text_completion"
    prompt_top = False

    def __init__(
        self, response_id: str, model: str, created: int, include_usage: bool, n: int = 1
    ) -> None:
        super().__init__(response_id, model, created, include_usage, n)
        self._text_head = self._head + b'[{"index":0,"text":'
        self._offsets: defaultdict[int, int] = defaultdict(int)  # per choice, text_offset

    def _legacy_logprobs(self, entries: list[dict[str, Any]], choice: int = 0) -> dict[str, Any]:
        offsets = []
        for e in entries:
            offsets.append(self._offsets[choice])
            self._offsets[choice] += len(e["token"])
        return {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [
                {t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries
            ],
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
        self, text: str, logprobs: list[dict[str, Any]] | None, calls: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self._offsets[0] = 0
        legacy = None if logprobs is None else self._legacy_logprobs(logprobs)
        return {"text": text, "logprobs": legacy}


def make_format(
    kind: Kind, request_id: str, model: str, created: int, include_usage: bool, n: int = 1
) -> ChunkFormat:
    """The renderer for an endpoint; ids follow OpenAI's prefixes."""
    if kind == "chat":
        return ChatFormat(f"chatcmpl-{request_id}", model, created, include_usage, n)
    return CompletionFormat(f"cmpl-{request_id}", model, created, include_usage, n)
