"""What a constraint may cost (issue 28): the hostile shapes found by the probe suite are
refused before any grammar backend sees them, naming the field and the limit; ordinary
schemas, regexes and grammars pass."""

from __future__ import annotations

import orjson
import pytest

from model_service.errors import InvalidArgument
from model_service.intake.bounds import Bounds
from model_service.intake.validation import validate_structured
from model_service.types import StructuredOutput

BOUNDS = Bounds()


def schema(value: object) -> StructuredOutput:
    return StructuredOutput("json_schema", orjson.dumps(value).decode())


def props(n: int, required: bool) -> dict:
    p = {f"p{i}": {"type": "string"} for i in range(n)}
    return {"type": "object", "properties": p, **({"required": list(p)} if required else {})}


HOSTILE = {
    "10,000 required properties": (schema(props(10_000, True)), "object properties"),
    "10,000 properties": (schema(props(10_000, False)), "object properties"),
    "properties spread over nesting": (
        schema({"type": "object", "properties": {f"o{i}": props(100, False) for i in range(60)}}),
        "object properties",
    ),
    "an enum of 5,000 strings of 200": (
        schema({"enum": ["x" * 200 + str(i) for i in range(5_000)]}),
        "enum and const values",
    ),
    "$ref n -> n": (schema({"$defs": {"n": {"$ref": "#/$defs/n"}}, "$ref": "#/$defs/n"}), "$ref"),
    "$ref to the root alone": (schema({"$ref": "#"}), "$ref"),
    "1,000 choices of 1 KB": (
        StructuredOutput("choice", tuple(f"{i}" + "c" * 1023 for i in range(1_000))),
        "characters of choices",
    ),
    "a{0,100000}": (StructuredOutput("regex", "a{0,100000}"), "repetition"),
    "a{100001}": (StructuredOutput("regex", "a{100001}"), "repetition"),
    "100 KB of (a|b)": (StructuredOutput("regex", "(a|b)" * 25_000), "characters of regex"),
    "a 200 KB grammar": (
        StructuredOutput("grammar", "\n".join(f'r{i} ::= r{i + 1} | "x"' for i in range(9_000))),
        "characters of grammar",
    ),
    "a chain of 5,000 GBNF rules (killed vLLM's engine)": (
        StructuredOutput(
            "grammar",
            "root ::= r0\n" + "".join(f'r{i} ::= "a" r{i + 1}\n' for i in range(4_999)),
        ),
        "grammar rules",
    ),
    "1,001 Lark rules": (
        StructuredOutput("grammar", "start: r0\n" + "".join(f'r{i}: "b"\n' for i in range(1_000))),
        "grammar rules",
    ),
    "a long pattern in a schema": (
        schema({"type": "string", "pattern": "b{5,50000}"}),
        "repetition",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_constraint_is_refused_naming_field_and_limit(case: str) -> None:
    so, says = HOSTILE[case]
    with pytest.raises(InvalidArgument) as info:
        validate_structured(so, BOUNDS)
    assert info.value.field == so.field
    assert says in str(info.value)
    if "$ref" not in says:
        assert "limit of" in str(info.value)


@pytest.mark.parametrize(
    "so",
    [
        schema(props(500, True)),
        schema({"enum": [f"v{i}" for i in range(1_000)]}),
        schema(
            {
                "$defs": {
                    "node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}
                },
                "$ref": "#/$defs/node",
            }
        ),  # recursive with a way out: allowed
        StructuredOutput("regex", r"[a-z]{1,1000}\{99999\}"),  # escaped braces are literals
        StructuredOutput("choice", ("yes", "no")),
        StructuredOutput("grammar", 'root ::= "a" | "b"'),
        StructuredOutput(
            "grammar", "root ::= r0\n" + "".join(f'r{i} ::= "a" r{i + 1}\n' for i in range(999))
        ),
    ],
    ids=[
        "500-required",
        "1000-enum",
        "recursive-tree",
        "escaped-braces",
        "choice",
        "grammar",
        "1000-rules",
    ],
)
def test_ordinary_constraints_pass(so: StructuredOutput) -> None:
    validate_structured(so, BOUNDS)


def test_the_bounds_are_the_configured_ones() -> None:
    with pytest.raises(InvalidArgument):
        validate_structured(schema(props(11, False)), Bounds(max_properties=10))
    validate_structured(schema(props(10, False)), Bounds(max_properties=10))
