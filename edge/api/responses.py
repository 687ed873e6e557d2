"""OpenAI's Responses API (`POST /v1/responses`): the response as named SSE events or one
`response` object (the request: `edge.api.responses_request`; `store: true` keeps it:
`edge.api.stored`). Each event depends on all before it, so a resume replays from the
start (`replay_from_start`)."""

from __future__ import annotations

from typing import Any

import orjson

from edge.api.choices import logprob_entries
from edge.api.responses_request import parse_responses
from edge.stream.job import Event
from edge.upstream.batch import is_prompt
from generated import sluice_pb2 as pb

_dumps = orjson.dumps

__all__ = ["ResponsesFormat", "parse_responses"]


def _raw(text: str, ids: Any) -> dict[str, Any]:
    """vLLM's `raw_message_tokens` entry of `input_messages` / `output_messages`."""
    return {"message": text, "tokens": list(ids), "type": "raw_message_tokens"}


def _usage(u: pb.Usage) -> dict[str, Any]:
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_prompt_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    }


class ResponsesFormat:
    """One generation as Responses API events (`edge.stream.job.Format`):
    `response.created`, `response.in_progress`, per output item `output_item.added`
    (+ `content_part.added`), `output_text.delta` / `function_call_arguments.delta`,
    their `.done`, `output_item.done`, then `response.completed` (or `.incomplete` when
    `max_output_tokens` cut it). `sequence_number` is the edge's event counter."""

    replay_from_start = True
    include_usage = False
    _prompt_raw: list[dict[str, Any]] | None

    def prompts_due(self) -> bool:
        return self.messages and self._prompt_raw is None

    def note_prompt(self, chunk: pb.TokenChunk) -> bool:
        """vLLM's `enable_response_messages`: keep the prompt's text and ids."""
        if not is_prompt(chunk):
            return False
        self._prompt_raw = [_raw(chunk.prompt_text, chunk.prompt_token_ids)]
        return True

    def __init__(self, request_id: str, model: str, created: int, echo: dict[str, Any]) -> None:
        self.response_id = f"resp_{request_id}"
        self._rid = request_id
        self._base = {
            "id": self.response_id,
            "object": "response",
            "created_at": created,
            "model": model,
            "error": None,
            "incomplete_details": None,
            **{k: v for k, v in echo.items() if k != "metadata"},
            "metadata": echo.get("metadata") or {},
        }
        self._items: list[dict[str, Any]] = []  # output items, the last one may be open
        self._open = False
        self._calls: dict[int, dict[str, Any]] = {}  # call index -> its item
        self.final: dict[str, Any] | None = None  # the finished response (`store: true`)
        # vLLM's `enable_response_messages` (set by the caller): the prompt as its message
        # brought it, the output's text and ids so far.
        self.messages = False
        self._prompt_raw = None
        self._output: tuple[list[str], list[int]] = ([], [])
        self._logprobs = "top_logprobs" in echo  # the output's, in its text parts

    # -- events -------------------------------------------------------------------------

    def _ev(self, out: list[Event], seq: int, kind: str, **fields: Any) -> None:
        data = _dumps({"type": kind, "sequence_number": seq + len(out), **fields})
        out.append((kind.encode(), data))

    def _response(self, status: str, final: pb.Final | None = None) -> dict[str, Any]:
        body = {**self._base, "status": status, "output": self._items, "usage": None}
        if final is not None:
            body["usage"] = _usage(final.usage)
            if final.reason == pb.FINISH_REASON_LENGTH:
                body["incomplete_details"] = {"reason": "max_output_tokens"}
            if self.messages:
                texts, ids = self._output
                body["input_messages"] = self._prompt_raw or []
                body["output_messages"] = [_raw("".join(texts), ids)] if texts or ids else []
        return body

    def opening_events(self, seq: int) -> list[Event]:
        out: list[Event] = []
        self._ev(out, seq, "response.created", response=self._response("in_progress"))
        self._ev(out, seq, "response.in_progress", response=self._response("in_progress"))
        return out

    def _close(self, out: list[Event], seq: int) -> None:
        """End the open item: its `.done` events."""
        if not self._open:
            return
        self._open = False
        item, index = self._items[-1], len(self._items) - 1
        item["status"] = "completed"
        if item["type"] == "message":
            part = item["content"][0]
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            lps = part.get("logprobs", [])
            self._ev(out, seq, "response.output_text.done", **ids, text=part["text"], logprobs=lps)
            self._ev(out, seq, "response.content_part.done", **ids, part=part)
        elif item["type"] == "reasoning":
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            text = item["content"][0]["text"]
            self._ev(out, seq, "response.reasoning_text.done", **ids, text=text)
        else:
            args = item["arguments"]
            ids = {"item_id": item["id"], "output_index": index}
            self._ev(out, seq, "response.function_call_arguments.done", **ids, arguments=args)
        self._ev(out, seq, "response.output_item.done", output_index=index, item=item)

    def _add(self, out: list[Event], seq: int, item: dict[str, Any]) -> None:
        self._close(out, seq)
        self._items.append(item)
        self._open = True
        index = len(self._items) - 1
        added = {**item, "content": []} if item["type"] in ("message", "reasoning") else item
        self._ev(out, seq, "response.output_item.added", output_index=index, item=added)
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            if self._logprobs:
                part["logprobs"] = []
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            self._ev(out, seq, "response.content_part.added", **ids, part=part)

    def delta(self, text: str, logprobs: Any) -> bytes:
        raise NotImplementedError("Responses streams are rendered through `events`")

    def _reasoning(self, out: list[Event], seq: int, text: str) -> None:
        """The model's thinking: a `reasoning` item (its text as `reasoning_text`)."""
        item = self._items[-1] if self._open else None
        if item is None or item["type"] != "reasoning":
            n = sum(1 for i in self._items if i["type"] == "reasoning")
            self._add(out, seq, {"id": f"rs_{self._rid}_{n}", "type": "reasoning", "summary": [],
                                 "content": [{"type": "reasoning_text", "text": ""}],
                                 "status": "in_progress"})  # fmt: skip
            item = self._items[-1]
        item["content"][0]["text"] += text
        ids = {"item_id": item["id"], "output_index": len(self._items) - 1, "content_index": 0}
        self._ev(out, seq, "response.reasoning_text.delta", **ids, delta=text)

    def events(self, chunk: pb.TokenChunk, logprobs: Any, seq: int) -> list[Event]:
        out: list[Event] = []
        if self.note_prompt(chunk):
            return out
        if self.messages:
            self._output[0].append(chunk.text)
            self._output[1].extend(chunk.token_ids)
        if chunk.reasoning:
            self._reasoning(out, seq, chunk.reasoning)
        if chunk.text:
            item = self._items[-1] if self._open else None
            if item is None or item["type"] != "message":
                n = sum(1 for i in self._items if i["type"] == "message")
                content: list[dict[str, Any]] = [
                    {"type": "output_text", "text": "", "annotations": []}
                ]
                if self._logprobs:
                    content[0]["logprobs"] = []
                self._add(out, seq, {"id": f"msg_{self._rid}_{n}", "type": "message",
                                     "role": "assistant", "status": "in_progress",
                                     "content": content})  # fmt: skip
                item = self._items[-1]
            item["content"][0]["text"] += chunk.text
            if self._logprobs and logprobs:
                item["content"][0]["logprobs"] += logprobs
            ids = {"item_id": item["id"], "output_index": len(self._items) - 1}
            delta = {"content_index": 0, "delta": chunk.text, "logprobs": logprobs or []}
            self._ev(out, seq, "response.output_text.delta", **ids, **delta)
        for t in chunk.tool_calls:
            if t.id:
                item = {"id": f"fc_{self._rid}_{t.index}", "type": "function_call",
                        "call_id": t.id, "name": t.name, "arguments": "",
                        "status": "in_progress"}  # fmt: skip
                self._calls[t.index] = item
                self._add(out, seq, item)
            item = self._calls.get(t.index)
            if item is None or not t.arguments:
                continue
            item["arguments"] += t.arguments
            index = self._items.index(item)
            self._ev(out, seq, "response.function_call_arguments.delta", item_id=item["id"],
                     output_index=index, delta=t.arguments)  # fmt: skip
        return out

    def ending(self, final: pb.Final, seq: int) -> list[Event]:
        out: list[Event] = []
        self._close(out, seq)
        status = "incomplete" if final.reason == pb.FINISH_REASON_LENGTH else "completed"
        self.final = self._response(status, final)
        self._ev(out, seq, f"response.{status}", response=self.final)
        return out

    # -- whole responses ----------------------------------------------------------------

    def logprobs(self, chunk: pb.TokenChunk) -> list[dict[str, Any]]:
        return logprob_entries(chunk)

    def collect(self, chunk: pb.TokenChunk, logprobs: Any) -> None:
        self.events(chunk, logprobs, 0)

    def whole(self, final: pb.Final, logprobs: bool) -> dict[str, Any]:
        self._close([], 0)
        status = "incomplete" if final.reason == pb.FINISH_REASON_LENGTH else "completed"
        self.final = self._response(status, final)
        return self.final

    # -- background responses (`edge.api.background`) -----------------------------------

    def snapshot(self, status: str) -> dict[str, Any]:
        """The response as it stands (`queued`, `in_progress`): the output so far."""
        return {**self._response(status), "output": [dict(i) for i in self._items]}

    def stopped(self, status: str, final: pb.Final | None, error: Any = None) -> dict[str, Any]:
        """A response that ended without finishing (`cancelled`, `failed`): its output so
        far, its open item closed as `incomplete`, the usage its final counted."""
        if self._open:
            self._items[-1]["status"] = "incomplete"
            self._open = False
        self.final = self._response(status, final)
        self.final["error"] = error
        return self.final
