"""OpenAI's Responses API (`POST /v1/responses`): the request as a chat generation, the
response as named SSE events or one `response` object (`store: true` keeps it:
`edge.api.stored`). Each event depends on all before it, so a resume replays from the
start (`replay_from_start`)."""

from __future__ import annotations

from typing import Any

import orjson

from edge.api import constraints, fields, nesting
from edge.api.schema import UINT32_MAX, GenRequest, common, int_field
from edge.errors import invalid
from edge.stream.job import Event
from generated import sluice_pb2 as pb

_dumps = orjson.dumps
_ROLES = frozenset({"system", "developer", "user", "assistant"})
_ECHO = ("temperature", "top_p", "max_output_tokens", "instructions", "metadata", "user",
         "previous_response_id")  # fmt: skip


def _text_of(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(param, "'content' must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(
            part.get("text"), str
        ):
            raise invalid(f"{param}[{j}]", "only text content parts are supported")
        texts.append(part["text"])
    return "\n".join(texts)


def _input(body: dict[str, Any]) -> list[pb.ChatMessage]:
    given = body.get("input")
    if isinstance(given, str):
        return [pb.ChatMessage(role="user", content=given)]
    if not isinstance(given, list) or not given:
        raise invalid("input", "'input' must be a string or a non-empty list of items")
    out: list[pb.ChatMessage] = []
    for i, item in enumerate(given):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(param, "each input item must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            if not isinstance(item.get("role"), str) or item["role"] not in _ROLES:
                raise invalid(f"{param}.role", f"role must be one of {sorted(_ROLES)}")
            text = _text_of(item.get("content"), f"{param}.content")
            out.append(pb.ChatMessage(role=item["role"], content=text))
        elif kind == "function_call":
            name, args = item.get("name"), item.get("arguments", "")
            if not isinstance(name, str) or not isinstance(args, str):
                raise invalid(param, "a function_call needs a 'name' and string 'arguments'")
            nesting.check_text(args, f"{param}.arguments")
            call = pb.ToolCall(id=str(item.get("call_id") or ""), name=name, arguments=args)
            if not (out and out[-1].role == "assistant" and not out[-1].content):
                out.append(pb.ChatMessage(role="assistant"))
            out[-1].tool_calls.append(call)
        elif kind == "reasoning":
            # A replayed history's reasoning (an OpenAI-shaped conversation continued
            # here): checked, not rendered, as OpenAI drops it from later turns' context.
            _reasoning_item(item, param)
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str) or not isinstance(item.get("call_id"), str):
                raise invalid(param, "a function_call_output needs 'call_id' and string 'output'")
            out.append(pb.ChatMessage(role="tool", content=output, tool_call_id=item["call_id"]))
        else:
            raise invalid(
                f"{param}.type", f"input items of type {str(kind)[:32]!r} are not supported"
            )
    return out


def _reasoning_item(item: dict[str, Any], param: str) -> None:
    for part_list in ("summary", "content"):
        parts = item.get(part_list)
        if parts is None:
            continue
        if not isinstance(parts, list) or not all(
            isinstance(p, dict) and isinstance(p.get("text"), str) for p in parts
        ):
            raise invalid(f"{param}.{part_list}", f"'{part_list}' must be a list of text parts")
    encrypted = item.get("encrypted_content")
    if encrypted is not None and not isinstance(encrypted, str):
        raise invalid(f"{param}.encrypted_content", "'encrypted_content' must be a string")


def _text_format(body: dict[str, Any]) -> pb.StructuredOutput | None:
    text = body.get("text")
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise invalid("text.format", "'format' must be an object")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return pb.StructuredOutput(json_object=True)
    if kind == "json_schema":
        if "schema" not in fmt:
            raise invalid("text.format.schema", "'schema' is required")
        wrapped = {"type": "json_schema", "json_schema": {"schema": fmt["schema"]}}
        return constraints.response_format({"response_format": wrapped})
    raise invalid("text.format.type", "'type' must be 'text', 'json_object' or 'json_schema'")


def _tools(body: dict[str, Any]) -> list[pb.Tool]:
    given = body.get("tools")
    if given is None:
        return []
    if not isinstance(given, list):
        raise invalid("tools", "'tools' must be a list")
    out = []
    for i, tool in enumerate(given):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise invalid(f"tools[{i}].type", "only tools of type 'function' are supported")
        if not isinstance(tool.get("name"), str):
            raise invalid(f"tools[{i}].name", "a function tool needs a 'name'")
        out.append(constraints.function_tool(tool, f"tools[{i}]"))
    return out


def parse_responses(body: dict[str, Any]) -> GenRequest:
    """A /v1/responses body -> GenRequest, or a 400: `input` (a string, or messages,
    `function_call` and `function_call_output` items), `instructions` (a system message
    first), `max_output_tokens`, sampling, `text.format`, function `tools`, `tool_choice`,
    `parallel_tool_calls`."""
    fields.check("responses", body)
    messages = _input(body)
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid("instructions", "'instructions' must be a string")
        messages.insert(0, pb.ChatMessage(role="system", content=instructions))
    req = GenRequest(kind="responses", messages=messages)
    common(body, req)
    req.structured = _text_format(body)
    req.max_tokens = int_field(body, "max_output_tokens", 1, UINT32_MAX)
    req.tools = _tools(body)
    req.tool_choice = constraints.tool_choice(body.get("tool_choice"), bool(req.tools))
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid("parallel_tool_calls", "'parallel_tool_calls' must be a boolean")
    req.parallel_tool_calls = parallel
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise invalid("metadata", "'metadata' must be an object")
    req.echo = {name: body.get(name) for name in _ECHO}
    req.echo["tools"] = body.get("tools") or []
    req.echo["tool_choice"] = body.get("tool_choice") or "auto"
    req.echo["parallel_tool_calls"] = True if parallel is None else parallel
    req.echo["text"] = body.get("text") or {"format": {"type": "text"}}
    store = body.get("store")
    if store is not None and not isinstance(store, bool):
        raise invalid("store", "'store' must be a boolean")
    req.echo["store"] = bool(store)  # kept only when asked (OpenAI's default is true)
    return req


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
    prompt_first = False

    def note_prompt(self, chunk: pb.TokenChunk) -> None:
        pass

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
            self._ev(out, seq, "response.output_text.done", **ids, text=part["text"], logprobs=[])
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
        if chunk.reasoning:
            self._reasoning(out, seq, chunk.reasoning)
        if chunk.text:
            item = self._items[-1] if self._open else None
            if item is None or item["type"] != "message":
                n = sum(1 for i in self._items if i["type"] == "message")
                content = [{"type": "output_text", "text": "", "annotations": []}]
                self._add(out, seq, {"id": f"msg_{self._rid}_{n}", "type": "message",
                                     "role": "assistant", "status": "in_progress",
                                     "content": content})  # fmt: skip
                item = self._items[-1]
            item["content"][0]["text"] += chunk.text
            ids = {"item_id": item["id"], "output_index": len(self._items) - 1}
            delta = {"content_index": 0, "delta": chunk.text, "logprobs": []}
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
        return []

    def collect(self, chunk: pb.TokenChunk, logprobs: Any) -> None:
        self.events(chunk, None, 0)

    def whole(self, final: pb.Final, logprobs: bool) -> dict[str, Any]:
        self._close([], 0)
        status = "incomplete" if final.reason == pb.FINISH_REASON_LENGTH else "completed"
        self.final = self._response(status, final)
        return self.final
