"""One generation as Anthropic's Messages API answers it: named SSE events (`message_start`
with the prompt's token count, `ping`, per content block `content_block_start` / `_delta` /
`_stop`, `message_delta`, `message_stop`) or one `message`. Thinking is a `thinking` block,
text a `text` block, each tool call a `tool_use` block. Events depend on all before them
(the open block's index): a resume replays from the start."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from edge.stream.job import Event
from generated import sluice_pb2 as pb

_dumps = orjson.dumps
_DELTAS = {"text": "text_delta", "thinking": "thinking_delta"}


def stop_reason(final: pb.Final) -> tuple[str, str | None]:
    """Anthropic's (stop_reason, stop_sequence) for how the generation ended."""
    if final.reason == pb.FINISH_REASON_LENGTH:
        return "max_tokens", None
    if final.reason == pb.FINISH_REASON_TOOL_CALLS:
        return "tool_use", None
    if final.stop_sequence:
        return "stop_sequence", final.stop_sequence
    return "end_turn", None


def usage(u: pb.Usage) -> dict[str, int]:
    """Anthropic's usage: `input_tokens` leaves out those read from the prefix cache."""
    return {
        "input_tokens": u.prompt_tokens - u.cached_prompt_tokens,
        "cache_read_input_tokens": u.cached_prompt_tokens,
        "output_tokens": u.completion_tokens,
    }


class MessagesFormat:
    """Messages API events and whole answers (`edge.stream.job.Format`)."""

    replay_from_start = True
    include_usage = False

    def __init__(self, request_id: str, model: str) -> None:
        self.message_id = f"msg_{request_id}"
        self._model = model
        self._input_tokens = 0
        self._started = False
        self._blocks: list[dict[str, Any]] = []  # content blocks; the last one may be open
        self._open = False
        self._calls: dict[int, int] = {}  # tool call index -> its block's index
        self._json: dict[int, str] = {}  # block index -> a tool_use block's input so far

    def prompts_due(self) -> bool:
        return False  # the prompt's ids come as the first chunk, through `events`

    def note_prompt(self, chunk: pb.TokenChunk) -> bool:
        return False

    def _ev(self, out: list[Event], kind: str, **fields: Any) -> None:
        out.append((kind.encode(), _dumps({"type": kind, **fields})))

    def _message(self, content: list[dict[str, Any]], final: pb.Final | None) -> dict[str, Any]:
        reason, sequence = stop_reason(final) if final is not None else (None, None)
        counts = {"input_tokens": self._input_tokens, "output_tokens": 0}
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage(final.usage) if final is not None else counts,
        }

    def _start(self, out: list[Event], chunk: pb.TokenChunk | None) -> None:
        """`message_start` (and a `ping`, as Anthropic sends) before anything else."""
        if self._started:
            return
        self._started = True
        if chunk is not None and chunk.prompt_token_ids:
            self._input_tokens = len(chunk.prompt_token_ids)
        self._ev(out, "message_start", message=self._message([], None))
        self._ev(out, "ping")

    def opening_events(self, seq: int) -> list[Event]:
        return []  # `message_start` waits for the prompt's ids (the worker's first message)

    def _signature(self, index: int) -> str:
        """A thinking block's signature: Anthropic's clients keep and send it back; ours
        only names the block (the same on a replay)."""
        return hashlib.sha256(f"{self.message_id}/{index}".encode()).hexdigest()[:32]

    def _close(self, out: list[Event]) -> None:
        if not self._open:
            return
        self._open = False
        index = len(self._blocks) - 1
        block = self._blocks[index]
        if block["type"] == "thinking":
            block["signature"] = self._signature(index)
            delta = {"type": "signature_delta", "signature": block["signature"]}
            self._ev(out, "content_block_delta", index=index, delta=delta)
        self._ev(out, "content_block_stop", index=index)

    def _add(self, out: list[Event], block: dict[str, Any]) -> int:
        self._close(out)
        self._blocks.append(block)
        self._open = True
        index = len(self._blocks) - 1
        self._ev(out, "content_block_start", index=index, content_block=dict(block))
        return index

    def _text(self, out: list[Event], kind: str, text: str) -> None:
        """More thinking or answer text: into the open block of its kind, or a new one."""
        block = self._blocks[-1] if self._open else None
        if block is None or block["type"] != kind:
            fresh = {"type": kind, kind: ""}
            if kind == "thinking":
                fresh["signature"] = ""
            self._add(out, fresh)
            block = self._blocks[-1]
        block[kind] += text
        delta = {"type": _DELTAS[kind], kind: text}
        self._ev(out, "content_block_delta", index=len(self._blocks) - 1, delta=delta)

    def delta(self, text: str, logprobs: Any) -> bytes:
        raise NotImplementedError("Messages streams are rendered through `events`")

    def events(self, chunk: pb.TokenChunk, logprobs: Any, seq: int) -> list[Event]:
        out: list[Event] = []
        self._start(out, chunk)
        if chunk.reasoning:
            self._text(out, "thinking", chunk.reasoning)
        if chunk.text:
            self._text(out, "text", chunk.text)
        for t in chunk.tool_calls:
            if t.id:
                block = {"type": "tool_use", "id": t.id, "name": t.name, "input": {}}
                self._calls[t.index] = self._add(out, block)
                self._json[self._calls[t.index]] = ""
            index = self._calls.get(t.index)
            if index is None or not t.arguments:
                continue
            self._json[index] += t.arguments
            delta = {"type": "input_json_delta", "partial_json": t.arguments}
            self._ev(out, "content_block_delta", index=index, delta=delta)
        return out

    def ending(self, final: pb.Final, seq: int) -> list[Event]:
        out: list[Event] = []
        self._start(out, None)
        self._close(out)
        reason, sequence = stop_reason(final)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        self._ev(out, "message_delta", delta=delta, usage=usage(final.usage))
        self._ev(out, "message_stop")
        return out

    # -- whole answers ------------------------------------------------------------------

    def logprobs(self, chunk: pb.TokenChunk) -> list[dict[str, Any]]:
        return []

    def collect(self, chunk: pb.TokenChunk, logprobs: Any) -> None:
        self.events(chunk, None, 0)

    def whole(self, final: pb.Final, logprobs: bool) -> dict[str, Any]:
        self._start([], None)
        self._close([])
        content = []
        for index, block in enumerate(self._blocks):
            if block["type"] == "tool_use":
                try:
                    given = orjson.loads(self._json[index])
                except orjson.JSONDecodeError:
                    continue  # cut by max_tokens: no call (as the chat path)
                if not isinstance(given, dict):
                    continue
                block = {**block, "input": given}
            content.append(block)
        if not content:  # Anthropic's shape of an empty answer: one empty text block
            content.append({"type": "text", "text": ""})
        return self._message(content, final)
