"""Tool calling in the worker: the schema a tool choice samples under, and the parsers
that turn a choice's streamed output into tool-call deltas."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from model_service.engines.sim.structured import pieces, structured_text
from model_service.engines.sim.text import VOCAB
from model_service.errors import InvalidArgument
from model_service.intake.tools import NamedCall, RequiredCalls, forced_structure, make_parser
from model_service.types import (
    GenerationRequest,
    SamplingParams,
    StructuredOutput,
    Tool,
    ToolCallDelta,
)

WEATHER = Tool(
    "get_weather",
    "Weather in a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
TIME = Tool("get_time")


def request(choice: str, function: str = "", parallel: bool = True) -> GenerationRequest:
    return GenerationRequest(
        "r",
        SamplingParams(),
        messages=(),
        tools=(WEATHER, TIME),
        tool_choice=choice,
        tool_function=function,
        parallel_tool_calls=parallel,
    )


def ids(i: int) -> str:
    return f"call_{i}"


def feed_all(parser: NamedCall | RequiredCalls, text: str) -> list[ToolCallDelta]:
    out: list[ToolCallDelta] = []
    for piece in pieces(text):
        content, calls = parser.feed(piece, [])
        assert content == ""
        out += calls
    out += parser.end()[1]
    return out


def test_required_schema_accepts_calls_of_either_tool_and_nothing_else() -> None:
    so = forced_structure(request("required"))
    assert so is not None and so.kind == "json_schema"
    schema = json.loads(so.value)  # type: ignore[arg-type]
    ok = [
        {"name": "get_weather", "parameters": {"city": "Paris"}},
        {"name": "get_time", "parameters": {}},
    ]
    jsonschema.validate(ok, schema)
    for bad in (
        [],
        [{"name": "rm_rf", "parameters": {}}],
        [{"name": "get_weather", "parameters": {}}],
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    single = json.loads(forced_structure(request("required", parallel=False)).value)  # type: ignore[union-attr,arg-type]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(ok, single)


def test_named_schema_is_the_function_parameters() -> None:
    so = forced_structure(request("function", "get_weather"))
    assert so is not None and json.loads(so.value) == WEATHER.parameters  # type: ignore[arg-type]
    empty = forced_structure(request("function", "get_time"))
    assert empty is not None and json.loads(empty.value) == {"type": "object", "properties": {}}  # type: ignore[arg-type]
    assert forced_structure(request("auto")) is None and forced_structure(request("none")) is None


def test_required_calls_stream_whole_calls_as_their_objects_complete() -> None:
    text = (
        '[{"name": "get_weather", "parameters": {"city": "Paris"}}, '
        '{"name": "get_time", "parameters": {}}]'
    )
    parser = RequiredCalls(ids)
    calls = feed_all(parser, text)
    assert calls == [
        ToolCallDelta(0, "call_0", "get_weather", '{"city": "Paris"}'),
        ToolCallDelta(1, "call_1", "get_time", "{}"),
    ]
    assert parser.called


def test_required_calls_cut_by_length_give_only_complete_calls() -> None:
    parser = RequiredCalls(ids)
    calls = feed_all(parser, '[{"name": "get_time", "parameters": {}}, {"name": "get_wea')
    assert calls == [ToolCallDelta(0, "call_0", "get_time", "{}")]


def test_named_call_streams_the_arguments_as_they_come() -> None:
    parser = NamedCall("get_weather", ids)
    calls = feed_all(parser, '{"city": "Paris"}')
    assert calls[0] == ToolCallDelta(0, "call_0", "get_weather", "{")
    assert all(c.id == "" and c.name == "" for c in calls[1:])
    assert "".join(c.arguments for c in calls) == '{"city": "Paris"}'
    assert NamedCall("f", ids).end() == ("", [ToolCallDelta(0, "call_0", "f", "{}")])


def test_auto_without_a_parser_is_refused_naming_tool_choice() -> None:
    with pytest.raises(InvalidArgument) as info:
        make_parser(request("auto"), ids, None)
    assert info.value.field == "chat.tool_choice"
    assert make_parser(request("none"), ids, None) is None


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": 3, "maximum": 5},
                "b": {"enum": ["x", "y"]},
                "c": {"type": "array", "items": {"type": "boolean"}, "minItems": 2},
            },
            "required": ["a", "b", "c"],
        },
        {
            "$defs": {
                "P": {"type": "object", "properties": {"n": {"type": "string", "minLength": 12}}}
            },
            "type": "object",
            "properties": {
                "p": {"$ref": "#/$defs/P"},
                "q": {"anyOf": [{"type": "null"}, {"type": "number"}]},
            },
        },
        {"type": "array", "items": {"const": 7}, "minItems": 1, "maxItems": 1},
    ],
)
def test_sim_writes_a_valid_instance_of_the_schema(schema: dict) -> None:
    for seed in range(20):
        rng = random.Random(seed)
        text = structured_text(
            StructuredOutput("json_schema", json.dumps(schema)), VOCAB, rng.randrange
        )
        jsonschema.validate(json.loads(text), schema)
        assert "".join(pieces(text)) == text


def test_sim_refuses_regex_and_grammar_by_field() -> None:
    for kind in ("regex", "grammar"):
        with pytest.raises(InvalidArgument) as info:
            structured_text(StructuredOutput(kind, "a+"), VOCAB, lambda n: 0)
        assert info.value.field == f"structured_output.{kind}"


def _nested_tool(name: str, inner: dict) -> Tool:
    """Parameters as Pydantic writes a model with a nested one: `$defs` and `$ref`s."""
    return Tool(
        name,
        parameters={
            "$defs": {"Place": inner},
            "type": "object",
            "properties": {"place": {"$ref": "#/$defs/Place"}},
            "required": ["place"],
        },
    )


def test_required_schema_hoists_defs_and_renames_clashing_ones() -> None:
    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    code = {"type": "object", "properties": {"code": {"type": "integer"}}, "required": ["code"]}
    req = GenerationRequest(
        "r",
        SamplingParams(),
        messages=(),
        tools=(_nested_tool("by_city", city), _nested_tool("by_code", code), WEATHER),
        tool_choice="required",
        parallel_tool_calls=True,
    )
    so = forced_structure(req)
    assert so is not None and so.field == "chat.tools"
    schema = json.loads(so.value)  # type: ignore[arg-type]
    assert schema["$defs"] == {"Place": city, "Place_1": code}
    validator = jsonschema.Draft202012Validator(schema)
    validator.validate(
        [
            {"name": "by_city", "parameters": {"place": {"city": "Paris"}}},
            {"name": "by_code", "parameters": {"place": {"code": 75}}},
        ]
    )
    for bad in (
        [{"name": "by_city", "parameters": {"place": {"code": 75}}}],
        [{"name": "by_code", "parameters": {"place": {"city": "Paris"}}}],
    ):
        with pytest.raises(jsonschema.ValidationError):
            validator.validate(bad)
    named = forced_structure(
        GenerationRequest(
            "r",
            SamplingParams(),
            messages=(),
            tools=req.tools,
            tool_choice="function",
            tool_function="by_code",
        )
    )
    assert named is not None and json.loads(named.value) == req.tools[1].parameters  # type: ignore[arg-type]
