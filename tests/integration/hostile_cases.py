"""Issue 28's hostile requests as the real-vLLM hostile module sends them
(`test_model_hostile.py`): each a route, the body's bytes (encoded once, before the
canary starts: a client encoding a 1 MB body holds its own GIL), the field its 400 names
and the seconds it may take. The constraints are refused by the worker (its up-front
bounds, vLLM's own checks, the bounded compile); the bodies that were the edge's 500s
(nesting orjson cannot write again, a Unicode digit, history arguments nested 5,000
deep) and the bodies with no bound of their own (1 MB tool descriptions and arguments,
128 tools of 25 KB) by the edge."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

COMPILE_S = 5.0  # the worker's --max-constraint-compile-s (its default)
CANARY: dict[str, Any] = {
    "model": "",
    "messages": [{"role": "user", "content": "Name a river."}],
    "max_tokens": 8,
    "temperature": 0,
}
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"


@dataclass(frozen=True)
class Case:
    route: str
    body: bytes
    field: str
    bound_s: float = 1.0


def props(n: int, required: bool, first: int = 0) -> dict[str, Any]:
    p = {f"p{i}": {"type": "string"} for i in range(first, first + n)}
    return {"type": "object", "properties": p, **({"required": list(p)} if required else {})}


def schema(value: dict[str, Any]) -> dict[str, Any]:
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": value}}
    }


def _nested(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        node = {"type": "array", "items": node}
    return node


def _chat(extra: dict[str, Any]) -> bytes:
    return json.dumps({**CANARY, **extra}).encode()


def _deep_objects(levels: int) -> str:
    return '{"a": ' * levels + "1" + "}" * levels


def _deep_schema(levels: int) -> str:
    """A JSON schema nesting `levels` properties, 2 JSON levels each (as text: no encoder
    writes that deep)."""
    return '{"type": "object", "properties": {"a": ' * levels + "{}" + "}}" * levels


def _text(route: str, extra: str) -> bytes:
    """A body with `extra` written into it as JSON text."""
    if route == CHAT:
        return _chat({})[:-1] + f", {extra}}}".encode()
    return f'{{"model": "", "input": "Name a river.", "max_output_tokens": 8, {extra}}}'.encode()


def _history_call(arguments: str) -> bytes:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    turn = [{"role": "assistant", "content": "", "tool_calls": [call]}]
    return _chat({"messages": [*CANARY["messages"], *turn]})


def _function_call(arguments: str) -> bytes:
    item = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": arguments}
    body = {"model": "", "input": [item], "max_output_tokens": 8}
    return json.dumps(body).encode()


# The edge names a structured output's field `response_format.<kind>` whichever parameter
# set it (guided_*, structured_outputs too); a nesting refusal names where it is.
RF = "response_format.json_schema"
CHAIN = "root ::= r0\n" + "".join(f'r{i} ::= "a" r{i + 1}\n' for i in range(4_999))
ENUM = {"enum": ["e" * 200 + str(i) for i in range(5_000)]}
TOOL = {"type": "function", "function": {"name": "f", "parameters": props(10_000, True)}}
CHOICES = [f"{i}" + "c" * 1023 for i in range(1_000)]
SELF_REF = {"$defs": {"n": {"$ref": "#/$defs/n"}}, "$ref": "#/$defs/n"}
DEEP_ARGS = "[" * 5_000
MB = 1_000_000
NAMED = {"type": "function", "function": {"name": "f"}}
TOOLS_25K = [
    {"type": "function", "function": {"name": f"f{i}", "parameters": props(700, True, 700 * i)}}
    for i in range(128)
]
BIG_DESCRIPTION = {"type": "function", "function": {"name": "f", "description": "d" * MB}}
HISTORY_ARGS = "messages[1].tool_calls[0].function.arguments"

CONSTRAINTS: dict[str, Case] = {
    "10,000 required properties": Case(CHAT, _chat(schema(props(10_000, True))), RF),
    "10,000 optional properties": Case(CHAT, _chat(schema(props(10_000, False))), RF),
    "5,000 enum strings of 200": Case(CHAT, _chat({"structured_outputs": {"json": ENUM}}), RF),
    "$ref n -> n": Case(CHAT, _chat(schema(SELF_REF)), RF),
    "$ref a -> a": Case(CHAT, _chat(schema({"$ref": "#"})), RF),
    "a schema nested 260 levels": Case(
        CHAT, _chat(schema(_nested(260))), f"{RF}.schema.items.items"
    ),
    "1,000 choices of 1 KB": Case(
        CHAT, _chat({"guided_choice": CHOICES}), "response_format.choice"
    ),
    "a{0,100000}": Case(CHAT, _chat({"guided_regex": "a{0,100000}"}), "response_format.regex"),
    "a chain of 5,000 grammar rules": Case(
        CHAT, _chat({"guided_grammar": CHAIN}), "response_format.grammar"
    ),
    "an unclosed regex group": Case(CHAT, _chat({"guided_regex": "(a"}), "response_format.regex"),
    "a grammar naming no rule": Case(
        CHAT, _chat({"guided_grammar": "root ::= nothing"}), "response_format.grammar"
    ),
    "10,000 required tool parameters": Case(
        CHAT, _chat({"tools": [TOOL], "tool_choice": "required"}), "tools"
    ),
}


def slow_cases(k: int = 0) -> dict[str, Case]:
    """Inside every up-front bound; their compiles are over the worker's time bound. `k`
    names another round's: the same cost under another hash (the worker keeps verdicts)."""
    letters = "ab" if k == 0 else f"{chr(ord('c') + k)}b"
    return {
        "3,000 optional properties": Case(
            CHAT, _chat(schema(props(3_000, False, first=50_000 * k))), RF, COMPILE_S + 2.0
        ),
        "100 KB of (a|b)": Case(
            CHAT,
            _chat({"guided_regex": f"({letters[0]}|{letters[1]})" * 20_000}),
            "response_format.regex",
            COMPILE_S + 2.0,
        ),
    }


CONSTRAINTS.update(slow_cases())
BODIES: dict[str, Case] = {
    "metadata 300 levels": Case(
        CHAT, _text(CHAT, f'"metadata": {_deep_objects(300)}'), "metadata.a.a.a.a"
    ),
    "metadata 1,000 levels": Case(
        RESPONSES, _text(RESPONSES, f'"metadata": {_deep_objects(1_000)}'), "metadata.a.a.a.a"
    ),
    "text.format 130 steps": Case(
        RESPONSES,
        _text(
            RESPONSES,
            f'"text": {{"format": {{"type": "json_schema", "name": "x", "schema": '
            f"{_deep_schema(130)}}}}}",
        ),
        "text.format.schema.properties.a",
    ),
    "tool parameters 260 levels, named": Case(
        CHAT,
        _text(
            CHAT,
            f'"tools": [{{"type": "function", "function": {{"name": "f", "parameters": '
            f'{_deep_schema(260)}}}}}], "tool_choice": {json.dumps(NAMED)}',
        ),
        "tools[0].function.parameters.properties",
    ),
    'logit_bias key "²"': Case(CHAT, _chat({"logit_bias": {"²": 1}}), "logit_bias"),
    "chat tool_calls arguments of 5,000 [": Case(CHAT, _history_call(DEEP_ARGS), HISTORY_ARGS),
    "Responses function_call arguments of 5,000 [": Case(
        RESPONSES, _function_call(DEEP_ARGS), "input[0].arguments"
    ),
    "a 1 MB tool description": Case(CHAT, _chat({"tools": [BIG_DESCRIPTION]}), "tools"),
    # 3.6 MB, decoded off the edge's loop (~90 ms of its CPU alone): on 2 cores beside the
    # engine and the canary it took 1.07 s once in 17 runs of the canary test.
    "128 tools of 25 KB, required": Case(
        CHAT, _chat({"tools": TOOLS_25K, "tool_choice": "required"}), "tools", 2.0
    ),
    "1 MB chat tool_calls arguments": Case(
        CHAT, _history_call(json.dumps({"a": "x" * MB})), HISTORY_ARGS
    ),
    "1 MB Responses function_call arguments": Case(
        RESPONSES, _function_call(json.dumps({"a": "x" * MB})), "input[0].arguments"
    ),
}
