"""The sim's structured outputs: one valid instance of a JSON schema, a JSON object or a
choice, written as its tokens (what a constrained engine's output looks like above it).
No grammar backend: regexes and grammars are refused by name."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from model_service.errors import InvalidArgument
from model_service.types import StructuredOutput

_PIECE = re.compile(r"\w+|\s+|[^\w\s]")
MAX_DEPTH = 12

Pick = Callable[[int], int]  # a random index below n


def structured_text(so: StructuredOutput, words: tuple[str, ...], pick: Pick) -> str:
    """The whole output a constrained generation makes."""
    if so.kind == "choice":
        return so.value[pick(len(so.value))]
    if so.kind == "json_object":
        return json.dumps({"answer": words[pick(len(words))]})
    if so.kind == "json_schema":
        schema = json.loads(so.value)  # type: ignore[arg-type]
        value = _Instance(schema, words, pick, so.field).of(schema, 0)
        sep = (",", ":") if so.disable_any_whitespace else (", ", ": ")
        return json.dumps(value, separators=sep, ensure_ascii=False)
    raise InvalidArgument(
        so.field, "the simulated engine follows JSON schemas, JSON objects and choices only"
    )


def pieces(text: str) -> list[str]:
    """The text cut into the sim's tokens: words, runs of spaces, single marks."""
    return _PIECE.findall(text)


class _Instance:
    def __init__(self, root: Any, words: tuple[str, ...], pick: Pick, field: str) -> None:
        self.root = root
        self.field = field
        self.words = words
        self.pick = pick

    def _ref(self, ref: str) -> Any:
        node = self.root
        for part in ref.removeprefix("#/").split("/"):
            if not part:
                continue
            if not isinstance(node, dict) or part not in node:
                raise InvalidArgument(self.field, f"unresolved $ref {ref!r}")
            node = node[part]
        return node

    def of(self, schema: Any, depth: int) -> Any:
        if not isinstance(schema, dict) or depth > MAX_DEPTH:
            return self.words[self.pick(len(self.words))]
        if "$ref" in schema:
            return self.of(self._ref(schema["$ref"]), depth + 1)
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return schema["enum"][self.pick(len(schema["enum"]))]
        for key in ("anyOf", "oneOf"):
            if schema.get(key):
                return self.of(schema[key][self.pick(len(schema[key]))], depth + 1)
        if schema.get("allOf"):
            return self.of(schema["allOf"][0], depth + 1)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind == "object" or (kind is None and "properties" in schema):
            props = schema.get("properties") or {}
            return {name: self.of(sub, depth + 1) for name, sub in props.items()}
        if kind == "array":
            lo = int(schema.get("minItems", 1))
            hi = int(schema.get("maxItems", max(lo, 2)))
            count = min(max(lo, 1), hi)
            return [self.of(schema.get("items", {}), depth + 1) for _ in range(count)]
        if kind == "integer":
            lo = int(schema.get("minimum", 0))
            hi = int(schema.get("maximum", lo + 99))
            return lo + self.pick(max(1, hi - lo + 1))
        if kind == "number":
            low = float(schema.get("minimum", 0))
            return low + self.pick(1000) / 10
        if kind == "boolean":
            return self.pick(2) == 1
        if kind == "null":
            return None
        word = self.words[self.pick(len(self.words))]
        return (word * (1 + int(schema.get("minLength", 0)) // len(word)))[
            : int(schema.get("maxLength", 10_000))
        ]
