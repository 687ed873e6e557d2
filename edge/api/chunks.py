"""The base of the OpenAI chunk formats (`edge.stream.job.Format`): per token the fast
path is one `orjson.dumps(text)` between a prefix and a suffix made once per stream; the
rich shapes (n > 1, tool calls, usage in every chunk, vLLM's token ids and prompt
logprobs) build each chunk as an object (`events`; `Job.rich`); whole responses gather
the chunks (`collect`, `whole`). `edge.api.formats` holds the two endpoints' layouts."""

from __future__ import annotations

from typing import Any

import orjson

from edge.api.choices import Collected, choice_reasons, logprob_entries, usage_dict
from edge.api.prompt_logprobs import vllm_layout
from edge.stream.job import FINISH_REASONS, Event
from edge.upstream.batch import is_prompt
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
        self.n = n  # choices in all
        # A completions batch: choices `per_prompt * p` to `per_prompt * (p + 1) - 1` are
        # prompt p's (set by the caller; n when not a batch).
        self.per_prompt = n
        # vLLM's `return_token_ids` (set by the caller; its chunks are built as objects):
        # the prompt's ids once (the worker's first message), each chunk's own ids.
        self.token_ids = False
        self.prompt_text = False  # chat: vLLM's `return_prompt_text` (set by the caller)
        # vLLM's `prompt_logprobs` (set by the caller): whether whole answers show them.
        self.show_prompt_logprobs = False
        self.prompt_first = False  # a prompt message per prompt comes before any token
        # What each prompt's message brought (by prompt): its ids, its logprobs, its text.
        self.prompt_ids: dict[int, list[int]] = {}
        self.prompt_texts: dict[int, str] = {}
        self.prompt_lps: dict[int, list[pb.TokenLogprob]] = {}
        self.prompt_usage: dict[int, pb.Usage] = {}  # with `continuous_usage`
        self._prompts_noted: set[int] = set()
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

    def prompts_due(self) -> bool:
        """Whether the stream reads more of the prompts' messages before its opening
        (`prompt_first`: one per prompt)."""
        return self.prompt_first and len(self._prompts_noted) < self.n // self.per_prompt

    def note_prompt(self, chunk: pb.TokenChunk) -> bool:
        """Keep a prompt's token ids and logprobs from the message that carries them
        (before its tokens; `chunk.choice` is the prompt's first choice); False: `chunk`
        is no such message."""
        if not is_prompt(chunk):
            return False
        p = chunk.choice // self.per_prompt
        self._prompts_noted.add(p)
        if chunk.prompt_token_ids:
            self.prompt_ids[p] = list(chunk.prompt_token_ids)
        if chunk.prompt_logprobs:
            self.prompt_lps[p] = list(chunk.prompt_logprobs)
        if chunk.prompt_text:
            self.prompt_texts[p] = chunk.prompt_text
        if chunk.HasField("usage") and p not in self.prompt_usage:  # not a continuation's
            self.prompt_usage[p] = chunk.usage
        return True

    def opening_usage(self, choice: int) -> pb.Usage | None:
        """vLLM's continuous usage on a chunk before any token (the role, the echo): the
        prompt's count, 0 completion tokens."""
        return self.prompt_usage.get(choice // self.per_prompt) if self.continuous_usage else None

    def _shown_prompt_logprobs(self, choice: int = 0) -> list[dict[str, Any] | None] | None:
        if not self.show_prompt_logprobs:
            return None
        return vllm_layout(self.prompt_lps.get(choice // self.per_prompt, []))

    def _prompt_ids(self, choice: int = 0) -> list[int] | None:
        return self.prompt_ids.get(choice // self.per_prompt) if self.token_ids else None

    def _prompt_ids_once(self, key: int) -> list[int] | None:
        """The prompt's ids the first time `key` (a choice, -1 the response) asks."""
        ids = self._prompt_ids(max(key, 0))
        if ids is None or key in self._prompt_sent:
            return None
        self._prompt_sent.add(key)
        return ids

    def opening_events(self, seq: int) -> list[Event]:
        """The event that opens a stream, if the format has one: with n > 1 one chunk
        holding every choice's opening (one event, so one id to resume after)."""
        if self.n == 1 and not (self.token_ids or self.prompt_text or self.continuous_usage):
            first = self.opening()
            return [] if first is None else [(None, first)]
        choices = [self._open_choice(c) for c in range(self.n)]
        if choices[0] is None:
            return []
        return [(None, self._chunk_of(choices, self.opening_usage(0)))]

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
        if self.prompt_text and -2 not in self._prompt_sent:  # vLLM's: the first chunk
            self._prompt_sent.add(-2)
            obj["prompt_text"] = self.prompt_texts.get(0, "")
        if usage is not None:
            obj["usage"] = usage_dict(usage)
        elif self.include_usage:
            obj["usage"] = None
        return _dumps(obj)

    def events(self, chunk: pb.TokenChunk, logprobs: Any, seq: int) -> list[Event]:
        """A chunk of any shape (choice, tool calls, usage, a choice's end) as events."""
        usage = chunk.usage if chunk.HasField("usage") else None
        if self.note_prompt(chunk):
            return []
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
        if self.note_prompt(chunk):
            return
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
            fields = self.choice(got.text, got.logprobs, got.tool_calls(reason), i)
            if got.reasoning and "message" in fields:  # chat: the thinking beside the answer
                fields["message"]["reasoning_content"] = "".join(got.reasoning)
            choice = {"index": i, **fields, "finish_reason": reason}
            if not self.prompt_top:  # vLLM's fields, null when not asked
                choice["prompt_logprobs"] = self._shown_prompt_logprobs(i)
                choice["prompt_token_ids"] = self._prompt_ids(i)
            choice["token_ids"] = got.ids if self.token_ids else None
            choices.append(choice)
        out = {**self._obj, "object": self.response_object, "choices": choices,
               "usage": usage_dict(final.usage)}  # fmt: skip
        if self.prompt_top:
            out["prompt_logprobs"] = self._shown_prompt_logprobs()
            out["prompt_token_ids"] = self._prompt_ids()
            out["prompt_text"] = self.prompt_texts.get(0, "") if self.prompt_text else None
        return out

    def delta(self, text: str, logprobs: list[dict[str, Any]] | None) -> bytes:
        raise NotImplementedError

    def finish(self, reason: str) -> bytes:
        raise NotImplementedError

    def usage(self, usage: pb.Usage) -> bytes:
        """The extra last chunk of `stream_options.include_usage`: no choices, the usage."""
        return self._head + b'[],"usage":' + _dumps(usage_dict(usage)) + b"}"

    def choice(
        self,
        text: str,
        logprobs: list[dict[str, Any]] | None,
        calls: list[dict[str, Any]],
        index: int = 0,
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
