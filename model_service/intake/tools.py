"""Tool calling, engine-independent: the JSON schema a required or named tool choice
samples under, and the parsers that turn a choice's output into tool-call deltas
(`auto`: the engine's parser, or refused)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from model_service.engines.base import CallParser, Delta, ParserFactory
from model_service.errors import InvalidArgument
from model_service.types import (
    EngineOutput,
    GenerationRequest,
    StructuredOutput,
    Tool,
    ToolCallDelta,
)

_EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


def call_id(seed: str, index: int) -> str:
    """A stable tool call id (`call_` + 24 hex digits) for call `index` of a generation."""
    digest = hashlib.blake2b(f"{seed}/{index}".encode(), digest_size=12).hexdigest()
    return f"call_{digest}"


def _params(tool: Tool) -> dict[str, Any]:
    return tool.parameters if tool.parameters else _EMPTY_OBJECT


_DEF_KEYS = ("$defs", "definitions")


def _renamed_refs(node: Any, renames: dict[str, str]) -> Any:
    """`node` with each `$ref` in `renames` pointed at its new name."""
    if isinstance(node, dict):
        out = {k: _renamed_refs(v, renames) for k, v in node.items()}
        ref = node.get("$ref")
        if isinstance(ref, str) and ref in renames:
            out["$ref"] = renames[ref]
        return out
    if isinstance(node, list):
        return [_renamed_refs(v, renames) for v in node]
    return node


def _hoisted(params: dict[str, Any], index: int, defs: dict[str, Any]) -> dict[str, Any]:
    """One tool's parameters without their `$defs` (and `definitions`), which move into
    `defs` (the combined schema's root, where `#/$defs/...` resolves); a name another tool
    already uses for a different schema is renamed, its references with it."""
    renames: dict[str, str] = {}
    for key in _DEF_KEYS:
        own = params.get(key)
        if not isinstance(own, dict):
            continue
        for name, schema in own.items():
            new = name
            if new in defs and defs[new] != schema:
                new = f"{name}_{index}"
            renames[f"#/{key}/{name}"] = f"#/$defs/{new}"
            defs[new] = schema
    if not renames:
        return params
    rest = {k: v for k, v in params.items() if k not in _DEF_KEYS}
    for name, schema in list(defs.items()):
        defs[name] = _renamed_refs(schema, renames)
    return dict(_renamed_refs(rest, renames))


def forced_structure(req: GenerationRequest) -> StructuredOutput | None:
    """The JSON schema a required or named tool choice samples under (None otherwise)."""
    if req.tool_choice == "function":
        tool = next(t for t in req.tools if t.name == req.tool_function)
        return StructuredOutput("json_schema", json.dumps(_params(tool)), source="chat.tools")
    if req.tool_choice != "required":
        return None
    defs: dict[str, Any] = {}
    one_of_each = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t.name]},
                "parameters": _hoisted(_params(t), i, defs),
            },
            "required": ["name", "parameters"],
        }
        for i, t in enumerate(req.tools)
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": one_of_each}}
    if not req.parallel_tool_calls:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return StructuredOutput("json_schema", json.dumps(schema), source="chat.tools")


class NamedCall:
    """The output is the named function's arguments: one call, streamed as it comes."""

    def __init__(self, name: str, ids: Callable[[int], str]) -> None:
        self.called = False
        self._name = name
        self._ids = ids

    def feed(self, text: str, token_ids: list[int]) -> Delta:
        if not text:
            return "", []
        if not self.called:
            self.called = True
            return "", [ToolCallDelta(0, self._ids(0), self._name, text)]
        return "", [ToolCallDelta(0, arguments=text)]

    def end(self) -> Delta:
        if not self.called:  # an empty output still answers with the call
            self.called = True
            return "", [ToolCallDelta(0, self._ids(0), self._name, "{}")]
        return "", []


class RequiredCalls:
    """The output is a JSON array of `{"name", "parameters"}`: each call goes out whole
    as soon as its object is complete."""

    def __init__(self, ids: Callable[[int], str]) -> None:
        self.called = False
        self._ids = ids
        self._text = ""
        self._pos = 0  # where the next element (or the array's end) starts
        self._count = 0
        self._decoder = json.JSONDecoder()

    def feed(self, text: str, token_ids: list[int]) -> Delta:
        self._text += text
        calls: list[ToolCallDelta] = []
        if "}" not in text:  # an element can only have ended with a brace
            return "", calls
        buf = self._text
        while True:
            pos = self._pos
            while pos < len(buf) and buf[pos] in " \t\r\n,[":
                pos += 1
            self._pos = pos
            if pos >= len(buf) or buf[pos] != "{":
                return "", calls
            try:
                element, end = self._decoder.raw_decode(buf, pos)
            except ValueError:
                return "", calls  # not complete yet
            self._pos = end
            if isinstance(element, dict) and isinstance(element.get("name"), str):
                args = json.dumps(element.get("parameters", {}), ensure_ascii=False)
                name, k = element["name"], self._count
                calls.append(ToolCallDelta(k, self._ids(k), name, args))
                self._count += 1
                self.called = True

    def end(self) -> Delta:
        return "", []


def feed(parser: CallParser, out: EngineOutput) -> list[ToolCallDelta]:
    """One engine output of a choice through its parser: `out.text` keeps the content, the
    calls found are returned (what the parser held back, too, once the choice ended)."""
    out.text, calls = parser.feed(out.text, out.token_ids)
    if out.finish_reason is not None:
        rest, more = parser.end()
        out.text += rest
        calls += more
    return calls


def make_parser(
    req: GenerationRequest, ids: Callable[[int], str], auto: ParserFactory | None
) -> CallParser | None:
    """The parser for a request's tool choice (None: its output is plain text)."""
    if not req.tools or req.tool_choice == "none":
        return None
    if req.tool_choice == "function":
        return NamedCall(req.tool_function, ids)
    if req.tool_choice == "required":
        return RequiredCalls(ids)
    parser = auto(req, ids) if auto is not None else None
    if parser is None:
        raise InvalidArgument(
            "chat.tool_choice",
            "tool choice 'auto' needs a worker started with --tool-call-parser (the model's "
            "call format); use 'required', a named function or 'none' instead",
        )
    return parser
