"""What a constraint may cost before the grammar backend compiles it: bounds on a JSON
schema's object properties, enum values, strings, and `$ref`s that lead only to
themselves; on a regex's length and repetition counts; on a grammar's size and rules and
the choices' size. The defaults are OpenAI's published structured-output limits (what
clients already live with) where it publishes one; over a bound: INVALID_ARGUMENT naming
the field and the limit."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from model_service.errors import InvalidArgument

# A rule's definition at a line's start: GBNF's `name ::=`, Lark's `name:` / `?name:`.
_RULE = re.compile(r"^[ \t]*[?!]?[A-Za-z_][\w.-]*[ \t]*(?:::=|:)", re.MULTILINE)
# A counted repetition `{m}`, `{m,}` or `{m,n}` (escaped braces are literals).
_REPEAT = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")


@dataclass(frozen=True, slots=True)
class Bounds:
    max_properties: int = 5_000  # object properties in one schema, all levels
    max_enum_values: int = 1_000  # enum and const values, all properties
    max_chars: int = 120_000  # property and definition names, enum/const strings, patterns
    max_repeat: int = 1_000  # the largest count in a regex repetition `{m,n}`
    # Rules of a grammar: vLLM's backend compiled 5,000 flat ones for 4 s and died on a
    # chain of 5,000; 1,000 of either compile within 0.5 s.
    max_rules: int = 1_000


def check_schema(schema: Any, field: str, bounds: Bounds) -> None:
    """Walk a parsed JSON schema (its nesting is already bounded) counting what compiles."""
    counts = {"properties": 0, "enum": 0, "chars": 0}
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            if key in ("properties", "patternProperties", "$defs", "definitions") and isinstance(
                value, dict
            ):
                if key == "properties":
                    counts["properties"] += len(value)
                counts["chars"] += sum(len(k) for k in value)
            elif key in ("enum", "const"):
                values = value if key == "enum" and isinstance(value, list) else [value]
                counts["enum"] += len(values)
                counts["chars"] += sum(len(v) for v in values if isinstance(v, str))
            elif key == "pattern" and isinstance(value, str):
                counts["chars"] += len(value)
                check_regex(value, field, bounds)
            elif key == "$ref" and isinstance(value, str) and _self_only(node, value, schema):
                raise InvalidArgument(
                    field, f"`$ref` {value[:64]!r} leads only to itself: no value can match"
                )
            if isinstance(value, dict | list):
                stack.append(value)
        _over(counts["properties"], bounds.max_properties, field, "object properties")
        _over(counts["enum"], bounds.max_enum_values, field, "enum and const values")
        _over(counts["chars"], bounds.max_chars, field, "characters of names and values")


def _self_only(node: dict[str, Any], ref: str, root: Any) -> bool:
    """Whether `ref` resolves to `node` itself, or to a definition that is nothing but a
    `$ref` back to itself: a schema no value can satisfy (and a grammar that never ends)."""
    target = _resolve(root, ref)
    if target is node:
        return len(node) == 1
    return isinstance(target, dict) and set(target) == {"$ref"} and target["$ref"] == ref


def _resolve(root: Any, ref: str) -> Any:
    if not ref.startswith("#"):
        return None
    node = root
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def check_regex(pattern: str, field: str, bounds: Bounds) -> None:
    _over(len(pattern), bounds.max_chars, field, "characters of regex")
    for m in _REPEAT.finditer(pattern):
        biggest = max(int(g) for g in m.groups() if g)
        _over(biggest, bounds.max_repeat, field, "as a regex repetition count")


def check_grammar(grammar: str, field: str, bounds: Bounds) -> None:
    _over(len(grammar), bounds.max_chars, field, "characters of grammar")
    _over(len(_RULE.findall(grammar)), bounds.max_rules, field, "grammar rules")


def check_text(value: str, field: str, what: str, bounds: Bounds) -> None:
    _over(len(value), bounds.max_chars, field, what)


def _over(value: int, limit: int, field: str, what: str) -> None:
    if value > limit:
        raise InvalidArgument(field, f"{value} {what}, over this worker's limit of {limit}")
