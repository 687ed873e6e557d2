"""No request body gets a 5xx from the edge (issue 28): a hypothesis property over every
field of every route's table (`edge.api.fields`) and the nested places a body carries
JSON of its own (messages, tools, schemas, logit_bias, Responses items), set to what an
attacker sends: nesting thousands deep, Unicode digits, integers past any width, NaN and
Infinity, lone surrogates, long strings, wrong types. Every answer is a 2xx, or a 4xx in
the API's own error shape (OpenAI's; Anthropic's on /v1/messages and its count_tokens), the
admin API's bodies included; the worker is a real sim worker, the edge a real uvicorn."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge.api.fields import TABLES
from tests.integration.edge_fixtures import Stack, stack

# /v1/embeddings in front of a generating worker: its body is parsed and checked in full,
# then refused (the model embeds nothing) unless a field was refused first.
ROUTES = {"chat": "/v1/chat/completions", "completion": "/v1/completions",
          "responses": "/v1/responses", "embeddings": "/v1/embeddings",
          "messages": "/v1/messages", "count_tokens": "/v1/messages/count_tokens",
          "chat_render": "/v1/chat/completions/render",
          "completion_render": "/v1/completions/render"}  # fmt: skip
# Routes whose body is another route's: (its bases, nested places and field table).
SAME_BODY = {"count_tokens": "messages", "chat_render": "chat", "completion_render": "completion"}
ANTHROPIC = {"messages", "count_tokens"}  # answer in Anthropic's error shape
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
BASES: dict[str, dict[str, Any]] = {
    "chat": {
        "model": "",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "tools": [TOOL],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {}}},
        "logit_bias": {"1": 1},
        "stream_options": {"include_usage": True},
        "documents": [{"title": "t", "text": "d"}],
        "chat_template_kwargs": {"x": 1},
        "return_token_ids": True,
    },
    "completion": {"model": "", "prompt": "hi", "max_tokens": 4, "logit_bias": {"1": 1}},
    "responses": {
        "model": "",
        "input": [
            {"type": "message", "role": "user", "content": "hi"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "r"}]},
        ],
        "max_output_tokens": 4,
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "text": {"format": {"type": "json_schema", "name": "s", "schema": {}}},
    },
    "embeddings": {"model": "", "input": ["hi", "there"], "encoding_format": "float"},
    "messages": {
        "model": "",
        "max_tokens": 4,
        "system": [{"type": "text", "text": "s"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}],
            },
        ],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "auto"},
        "stop_sequences": ["zz"],
        "metadata": {"user_id": "u"},
    },
}
BASES["count_tokens"] = {k: v for k, v in BASES["messages"].items() if k != "max_tokens"}
BASES["chat_render"], BASES["completion_render"] = BASES["chat"], BASES["completion"]
KEY = "<key>"  # a place whose hostile part is an object's key, not a value
ADMIN_KEY = "hostile-bodies-admin-key-0123"
HEADERS = {"content-type": "application/json", "authorization": f"Bearer {ADMIN_KEY}"}
# The admin API's bodies (method, path, a body it takes), in OpenAI's error shape too.
ADMIN_ROUTES = [
    ("POST", "/admin/pools", {"name": "p2", "workers": ["127.0.0.1:1"], "weight": 1,
                              "policy": "least_load", "rollback": {"window_s": 5}}),
    ("PUT", "/admin/pools/default/weight", {"weight": 1}),
    ("POST", "/admin/pools/default/workers", {"address": "127.0.0.1:2"}),
    ("POST", "/admin/adapters", {"name": "a", "path": "/nonexistent"}),
    ("POST", "/admin/rollouts", {"canary": "no-such-pool", "stable": "default",
                                 "steps": [10, 100], "hold_s": 60,
                                 "analysis": {"min_samples": 20, "window_s": 60,
                                              "max_error_rate_increase": 0.02}}),
]  # fmt: skip
# Places inside a body that hold JSON of their own, beside every top-level field.
NESTED: dict[str, list[tuple[Any, ...]]] = {
    "chat": [
        ("messages", 0, "content"),
        ("messages", 0, "role"),
        ("messages", 0, "tool_calls"),
        ("tools", 0, "function", "parameters"),
        ("tools", 0, "function", "name"),
        ("tools", 0, "function", "description"),
        ("response_format", "json_schema", "schema"),
        ("response_format", "json_schema", "schema", "properties"),
        ("logit_bias", "1"),
        ("logit_bias", KEY),
        ("response_format", "json_schema", "schema", "properties", KEY),
        ("tools", 0, "function", "parameters", "properties", KEY),
        ("stream_options", KEY),
        ("stream_options", "include_usage"),
        ("tool_choice", "function"),
        ("documents", 0, "text"),
        ("documents", 0, KEY),
        ("chat_template_kwargs", "x"),
        ("chat_template_kwargs", KEY),
    ],
    "completion": [
        ("prompt", 0),
        ("logit_bias", "1"),
        ("logit_bias", KEY),
        ("structured_outputs", "regex"),
        ("structured_outputs", KEY),
    ],
    "responses": [
        ("input", 0, "content"),
        ("input", 0, "type"),
        ("input", 0, "arguments"),
        ("input", 1, "summary"),
        ("input", 1, "summary", 0, "text"),
        ("input", 1, "encrypted_content"),
        ("tools", 0, "parameters"),
        ("text", "format", "schema"),
        ("text", "format"),
        ("metadata", "k"),
        ("metadata", KEY),
        ("tools", 0, "parameters", "properties", KEY),
    ],
    "embeddings": [("input", 0), ("input", 1), ("input", KEY)],
    "messages": [
        ("messages", 0, "content"),
        ("messages", 0, "role"),
        ("messages", 0, "content", 0, "text"),
        ("messages", 0, "content", 0, "type"),
        ("messages", 1, "content", 0, "input"),
        ("messages", 1, "content", 0, "name"),
        ("messages", 1, "content", 0, "id"),
        ("messages", 2, "content", 0, "content"),
        ("messages", 2, "content", 0, "tool_use_id"),
        ("system", 0, "text"),
        ("tools", 0, "input_schema"),
        ("tools", 0, "name"),
        ("tools", 0, "input_schema", "properties", KEY),
        ("tool_choice", "type"),
        ("tool_choice", "name"),
        ("metadata", "user_id"),
        ("metadata", KEY),
        ("stop_sequences", 0),
    ],
}
for _kind, _same in SAME_BODY.items():
    NESTED[_kind] = NESTED[_same]


@dataclass(frozen=True)
class Deep:
    """JSON nested `depth` levels of lists or objects, written as text (no encoder
    recurses that far)."""

    depth: int
    objects: bool

    def text(self) -> str:
        if self.objects:
            return '{"a":' * self.depth + "0" + "}" * self.depth
        return "[" * self.depth + "0" + "]" * self.depth


class Raw(str):
    """JSON text sent as it is (NaN, Infinity, numbers no parser takes)."""


def encode(value: Any) -> str:
    if isinstance(value, Deep):
        return value.text()
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{encode(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(encode(v) for v in value) + "]"
    return json.dumps(value)  # lone surrogates come out as \ud800 escapes


UNICODE_DIGITS = ["²", "٣", "߂", "१", "\U0001d7d8", "Ⅻ", "½", "1\u0301"]
leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=18, max_value=400).map(lambda k: 10**k),
    st.integers(min_value=18, max_value=400).map(lambda k: -(10**k)),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([Raw(t) for t in ("NaN", "Infinity", "-Infinity", "1e400", "1E-400", "0x10")]),
    st.text(max_size=40),
    st.sampled_from(UNICODE_DIGITS),
    st.sampled_from(["\ud800", "a\udfffb", "\x00", "\u2028", "\ufeff"]),
    st.integers(min_value=1_000, max_value=200_000).map(lambda n: "x" * n),
)
keys = st.one_of(
    st.text(max_size=8),
    st.sampled_from(UNICODE_DIGITS),
    st.sampled_from(["\ud800", "-1", "1.5", " 1", "1e3", "0x1", "99999999999999999999", ""]),
)
hostile = st.one_of(
    leaf,
    st.builds(Deep, st.integers(min_value=1, max_value=3_000), st.booleans()),
    st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(keys, inner, max_size=4),
        ),
        max_leaves=8,
    ),
)


def places(kind: str) -> list[tuple[Any, ...]]:
    table = TABLES[SAME_BODY.get(kind, kind)]
    return sorted({(name,) for name in table}, key=str) + NESTED[kind] * 4 + [("x_unknown",)]


def with_value(body: dict[str, Any], path: tuple[Any, ...], value: Any, key: str) -> dict[str, Any]:
    """A copy of `body` with `value` at `path` (creating objects on the way), or with
    `key` as a key where the path ends in KEY."""
    if path[-1] == KEY:
        path, value = path[:-1], {key: 1}
    out = json.loads(json.dumps(body))
    node: Any = out
    for step in path[:-1]:
        if isinstance(node, list):
            node = node[step] if isinstance(step, int) and step < len(node) else node[0]
            continue
        if not isinstance(node.get(step), (dict, list)):
            node[step] = [{}] if isinstance(path[path.index(step) + 1], int) else {}
        node = node[step]
    last = path[-1]
    if isinstance(node, list):
        if isinstance(last, int) and last < len(node):
            node[last] = value
        else:
            node.append(value)
    else:
        node[last] = value
    return out


@pytest.fixture(scope="module")
def edge() -> Iterator[Stack]:
    with stack(("--sim-ttft", "0", "--sim-token-delay", "0"), ("--admin-key", ADMIN_KEY)) as s:
        yield s


def check(client: httpx.Client, kind: str, text: str, method: str = "POST") -> None:
    """`kind`: a key of ROUTES, or an admin path."""
    r = client.request(method, ROUTES.get(kind, kind), headers=HEADERS,
                       content=text.encode("utf-8", "surrogatepass"))  # fmt: skip
    assert r.status_code < 500, (r.status_code, r.text[:300], text[:300])
    if r.status_code >= 400 and kind in ANTHROPIC:
        doc = r.json()
        assert doc["type"] == "error" and set(doc["error"]) == {"type", "message"}, doc
        assert doc["error"]["type"].endswith("_error") and doc["error"]["message"], doc
    elif r.status_code >= 400:
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["message"], err
        assert isinstance(err["type"], str) and "code" in err and "param" in err, err


@pytest.mark.parametrize("kind", sorted(ROUTES))
def test_no_body_gets_a_5xx(edge: Stack, kind: str) -> None:
    with httpx.Client(base_url=edge.base, timeout=20) as client:
        check(client, kind, encode(BASES[kind]))  # the base itself is served

        @settings(
            max_examples=400,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(path=st.sampled_from(places(kind)), value=hostile, key=keys)
        def one(path: tuple[Any, ...], value: Any, key: str) -> None:
            check(client, kind, encode(with_value(BASES[kind], path, value, key)))

        one()


@pytest.mark.parametrize("route", ADMIN_ROUTES, ids=lambda r: f"{r[0]} {r[1]}")
def test_no_admin_body_gets_a_5xx(edge: Stack, route: tuple[str, str, dict[str, Any]]) -> None:
    method, path, base = route
    places = [(k,) for k in base] + [("x_unknown",)]
    places += [(k, i) for k, v in base.items() if isinstance(v, dict) for i in v]
    places += [(k, i) for k, v in base.items() if isinstance(v, list) for i in range(len(v))]
    with httpx.Client(base_url=edge.base, timeout=20) as client:

        @settings(
            max_examples=200,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(place=st.sampled_from(places), value=hostile)
        def one(place: tuple[Any, ...], value: Any) -> None:
            check(client, path, encode(with_value(base, place, value, "")), method)

        one()


def test_raw_bodies_that_are_not_json_objects(edge: Stack) -> None:
    """Bodies broken below the field level: each is a 400 in the error shape."""
    raws = ["", "{", "[]", "null", '"x"', "{" * 100_000, '{"model": NaN}', "\ud800",
            '{"messages": [{"role": "user", "content": "\\ud800"}]}', "{}\x00"]  # fmt: skip
    with httpx.Client(base_url=edge.base, timeout=20) as client:
        for kind in ROUTES:
            for raw in raws:
                check(client, kind, raw)
