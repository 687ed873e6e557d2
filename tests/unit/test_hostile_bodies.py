"""Hostile request bodies (issue 28), from the raw bytes through the parsers: every parse
error is a 400 naming the field, never a 500 (orjson writes only 254 levels, `"²"` is a
digit to `str.isdigit` but not to `int`). The worker refuses the same by name."""

from __future__ import annotations

import threading
from typing import Any

import orjson
import pytest

from edge.api import bodies
from edge.api.messages import parse_messages
from edge.api.nesting import MAX_DEPTH
from edge.api.responses import parse_responses
from edge.api.schema import decode_body, parse_chat, parse_completion
from edge.config import SecurityConfig
from edge.errors import ApiError
from generated import sluice_pb2 as pb
from model_service.config import LimitsConfig
from model_service.errors import InvalidArgument
from model_service.intake.decode import request_from_pb
from model_service.intake.validation import validate_request
from model_service.types import ModelInfo

USER = '[{"role": "user", "content": "hi"}]'
TOOL_JSON = '{"type": "function", "function": {"name": "f", "description": "%s"}}' % ("d" * 600)


def nested(levels: int) -> str:
    """A JSON object `levels` deep: {"a": {"a": ... 1}}."""
    return '{"a": ' * levels + "1" + "}" * levels


def schema_nested(levels: int) -> str:
    """A JSON schema nesting `levels` properties, 2 JSON levels each."""
    return '{"type": "object", "properties": {"a": ' * levels + "{}" + "}}" * levels


def chat(extra: str) -> bytes:
    return f'{{"model": "m", "messages": {USER}, {extra}}}'.encode()


def history(arguments: str) -> bytes:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]}]
    return orjson.dumps({"model": "m", "messages": messages})


DEEP_ARGS = "[" * 5000
CASES: list[tuple[str, bytes, str | None]] = [
    ("chat", chat(f'"metadata": {nested(300)}'), "metadata.a.a.a.a"),
    ("responses", f'{{"input": "hi", "metadata": {nested(1000)}}}'.encode(), "metadata.a.a.a.a"),
    ("chat", b"[" * 2000 + b"]" * 2000, None),  # past orjson's own 1,024
    (
        "responses",
        f'{{"input": "hi", "text": {{"format": {{"type": "json_schema", "schema": '
        f"{schema_nested(130)}}}}}}}".encode(),
        "text.format.schema.properties.a",
    ),
    (
        "chat",
        chat(
            '"tools": [{"type": "function", "function": {"name": "f", "parameters": '
            f'{schema_nested(260)}}}}}], "tool_choice": {{"type": "function", '
            '"function": {"name": "f"}}'
        ),
        "tools[0].function.parameters.properties",
    ),
    (
        "chat",
        chat(
            f'"response_format": {{"type": "json_schema", "json_schema": {{"schema": '
            f"{orjson.dumps(schema_nested(200)).decode()}}}}}"
        ),
        "response_format.json_schema.schema.properties.a.properties.a.properties",
    ),
    ("chat", chat('"logit_bias": {"\\u00b2": 1}'), "logit_bias"),
    ("chat", chat('"logit_bias": {"' + "1" * 5000 + '": 1}'), "logit_bias"),
    ("completion", b'{"prompt": "x", "logit_bias": {"\xd9\xa3": 1}}', "logit_bias"),  # Arabic 3
    ("chat", chat('"temperature": 1e400'), None),
    ("chat", chat('"max_tokens": 123456789012345678901234567890'), "max_tokens"),
    ("chat", chat('"seed": 1e300'), "seed"),
    ("chat", chat('"top_p": NaN'), None),
    ("chat", chat('"user": "\\ud800"'), None),
    ("chat", b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}', None),
    ("chat", history(DEEP_ARGS), "messages[1].tool_calls[0].function.arguments"),
    (
        "responses",
        orjson.dumps({"input": [{"type": "function_call", "name": "f", "arguments": DEEP_ARGS}]}),
        "input[0].arguments",
    ),
]
# Anthropic's Messages API: the same readers under its own field names.
ANTHROPIC = '"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]'
CASES += [
    ("messages", f'{{{ANTHROPIC}, "metadata": {nested(300)}}}'.encode(), "metadata.a.a.a.a"),
    (
        "messages",
        f'{{{ANTHROPIC}, "tools": [{{"name": "f", "input_schema": '
        f"{schema_nested(260)}}}]}}".encode(),
        "tools[0].input_schema.properties.a",
    ),
    ("messages", f'{{{ANTHROPIC}, "temperature": 1e400}}'.encode(), None),
    ("messages", f'{{{ANTHROPIC}, "stop_sequences": ["END", ""]}}'.encode(), "stop_sequences"),
    ("messages", f'{{{ANTHROPIC}, "metadata": {{"user_id": 7}}}}'.encode(), "metadata.user_id"),
]
PARSERS: dict[str, Any] = {
    "messages": parse_messages,
    "chat": parse_chat,
    "completion": parse_completion,
    "responses": parse_responses,
}


@pytest.mark.parametrize(("kind", "raw", "param"), CASES)
def test_every_parse_error_is_a_400_naming_the_field(
    kind: str, raw: bytes, param: str | None
) -> None:
    with pytest.raises(ApiError) as info:
        PARSERS[kind](decode_body(raw))
    err = info.value
    assert (err.status, err.param) == (400, param), err.message
    assert err.body()["error"]["param"] == param  # type: ignore[index]


def test_nesting_up_to_the_limit_is_taken_and_written_again() -> None:
    body = decode_body(f'{{"input": "hi", "metadata": {{"k": {nested(MAX_DEPTH - 2)}}}}}'.encode())
    req = parse_responses(body)
    assert orjson.loads(orjson.dumps(req.echo["metadata"])) == body["metadata"]


def test_arguments_that_are_not_json_pass_as_text() -> None:
    req = parse_chat(decode_body(history("[not json")))
    assert req.messages is not None and req.messages[1].tool_calls[0].arguments == "[not json"


# -- the worker, for callers that come over gRPC directly --------------------------------

MODEL = ModelInfo(id="m", max_model_len=100, engine="sim", default_max_tokens=50)


def start_with(arguments: str = "{}", parameters: str = "", schema: str = "") -> pb.StartGeneration:
    start = pb.StartGeneration(request_id="r")
    start.chat.messages.add(role="user", content="hi")
    start.chat.messages.add(role="assistant").tool_calls.add(id="c", name="f", arguments=arguments)
    if parameters:
        start.chat.tools.add(name="f", parameters_json=parameters)
    if schema:
        start.structured_output.json_schema = schema
    return start


@pytest.mark.parametrize(
    ("start", "field"),
    [
        (start_with(arguments=DEEP_ARGS), "chat.messages[1].tool_calls[0].arguments"),
        (start_with(arguments="[" * 200 + "]" * 200), "chat.messages[1].tool_calls[0].arguments"),
        (start_with(parameters=DEEP_ARGS), "chat.tools[0].parameters_json"),
        (start_with(schema="[" * 5000), "structured_output.json_schema"),
        (start_with(schema=schema_nested(100)), "structured_output.json_schema"),
    ],
)
def test_worker_refuses_deep_json_by_name(start: pb.StartGeneration, field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        validate_request(request_from_pb(start), MODEL, LimitsConfig())
    assert info.value.field == field
    assert info.value.message.startswith(f"{field}: nests deeper than")


def test_worker_takes_arguments_that_are_text_or_shallow_json() -> None:
    validate_request(request_from_pb(start_with(arguments="[oops")), MODEL, LimitsConfig())
    validate_request(request_from_pb(start_with(arguments='{"a": [1]}')), MODEL, LimitsConfig())


async def test_a_large_body_is_parsed_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over OFF_LOOP_BYTES the body's JSON, fields and size limits are read in the parse
    thread (inline, 128 tools of 25 KB held the edge's loop ~100 ms); a small body inline;
    a 400 comes back from the thread as from the loop."""
    on_loop: list[bool] = []
    real = bodies.decode_body

    def recorded(raw: bytes) -> dict[str, Any]:
        on_loop.append(threading.current_thread() is threading.main_thread())
        return real(raw)

    monkeypatch.setattr(bodies, "decode_body", recorded)
    small = chat('"max_tokens": 4')
    text = "u" * bodies.OFF_LOOP_BYTES
    large = f'{{"model": "m", "messages": [{{"role": "user", "content": "{text}"}}]}}'.encode()
    req = await bodies.parse("chat", await bodies.decode(large), len(large), SecurityConfig())
    assert req.messages is not None and req.messages[0].content == text
    await bodies.decode(small)
    wide = chat(f'"tools": [{", ".join([TOOL_JSON] * 129)}]')
    with pytest.raises(ApiError) as info:
        await bodies.parse("chat", await bodies.decode(wide), len(wide), SecurityConfig())
    assert (info.value.status, info.value.param) == (400, "tools")
    assert on_loop == [False, True, False]
