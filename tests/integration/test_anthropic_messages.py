"""Anthropic's Messages API through the official `anthropic` SDK against a real edge and a
real sim worker: whole and streamed answers (the stream helper's final message equals the
whole answer), tools forced by `any` and by name, a tool-use history, stop sequences,
count_tokens, `x-api-key` auth, and bad input in Anthropic's error shape. (On the real
SmolLM2 worker: test_model_openai.py; the golden transcripts: test_golden_streams.py.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from tests.integration.edge_fixtures import Stack, parse_sse, stack

KEY = "sk-anthropic-test-key-0123456789"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
}
TOOLS: Any = [
    {"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER},
    {"name": "get_time", "input_schema": {"type": "object", "properties": {}}},
]
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
EVENT_ORDER = ["message_start", "ping", "content_block_start"]
# This SDK's `create` has no sampling parameters; the API (and vLLM's) still take them.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def sim() -> Iterator[Stack]:
    with stack(("--sim-token-delay", "0.001"), edge_env={"SLUICE_API_KEYS": f"t:{KEY}"}) as s:
        yield s


@pytest.fixture
def client(sim: Stack) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=sim.base, api_key=KEY, max_retries=0) as c:
        yield c


def _same(streamed: Any, whole: Any) -> None:
    """The stream helper's final message is the whole answer (message and call ids are per
    generation; the second may read part of its prompt from the sim's prefix cache)."""
    a, b = streamed.model_dump(), whole.model_dump()
    assert a.pop("id").startswith("msg_") and b.pop("id").startswith("msg_")
    for m in (a, b):
        m["usage"]["input_tokens"] += m["usage"].pop("cache_read_input_tokens")
        for block in m["content"]:
            if block["type"] == "tool_use":
                assert block.pop("id").startswith("call_")
    assert a == b


def test_whole_and_streamed_answers_are_the_same_message(client: anthropic.Anthropic) -> None:
    turn = {"role": "user", "content": [{"type": "text", "text": "Rivers?"}]}
    kw: Any = {"model": "", "max_tokens": 12, "extra_body": GREEDY, "system": "Be brief.",
               "messages": [turn]}  # fmt: skip
    whole = client.messages.create(**kw)
    assert whole.role == "assistant" and whole.type == "message"
    assert whole.stop_reason == "max_tokens" and whole.usage.output_tokens == 12
    assert [b.type for b in whole.content] == ["text"] and whole.content[0].text  # type: ignore[union-attr]
    with client.messages.stream(**kw) as stream:
        names = [event.type for event in stream]
        streamed = stream.get_final_message()
    _same(streamed, whole)
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    # count_tokens counts what the generation prefilled.
    counted = client.messages.count_tokens(model="", system=kw["system"], messages=kw["messages"])
    assert counted.input_tokens == whole.usage.input_tokens > 0


def test_the_raw_stream_has_anthropics_named_events(sim: Stack) -> None:
    body = {"model": "", "max_tokens": 5, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Hi"}]}  # fmt: skip
    r = httpx.post(f"{sim.base}/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in parse_sse(r.content) if "data" in e]
    names = [e["event"] for e in events]
    datas = [json.loads(e["data"]) for e in events]
    assert [d["type"] for d in datas] == names  # each data's type is its event's name
    assert names == [*EVENT_ORDER, *["content_block_delta"] * len(names[3:-3]),
                     "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    start = datas[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert datas[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert datas[-2]["usage"]["output_tokens"] == 5
    assert datas[-2]["usage"]["input_tokens"] == start["usage"]["input_tokens"] > 0


def test_a_stop_sequence_ends_the_answer_before_it(client: anthropic.Anthropic) -> None:
    kw: Any = {"model": "", "max_tokens": 30, "extra_body": GREEDY, "messages": ASK}
    text = client.messages.create(**kw).content[0].text  # type: ignore[union-attr]
    stop = " " + text.split()[3]
    cut = client.messages.create(**kw, stop_sequences=[stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[: text.index(stop)]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}], ids=["any", "named"]
)
def test_forced_tool_use_streamed_and_not_and_a_second_turn_follows(
    client: anthropic.Anthropic, choice: Any
) -> None:
    kw: Any = {"model": "", "max_tokens": 200, "extra_body": GREEDY, "messages": ASK,
               "tools": TOOLS, "tool_choice": choice}  # fmt: skip
    whole = client.messages.create(**kw)
    assert whole.stop_reason == "tool_use"
    uses = [b for b in whole.content if b.type == "tool_use"]
    assert uses and len(uses) == len(whole.content)
    for use in uses:
        if use.name == "get_weather":
            jsonschema.validate(use.input, WEATHER)
    if choice["type"] == "tool":
        assert [u.name for u in uses] == ["get_weather"]
    with client.messages.stream(**kw) as stream:
        streamed = stream.get_final_message()
    _same(streamed, whole)
    history: Any = [
        *ASK,
        {"role": "assistant", "content": [u.model_dump(exclude_none=True) for u in uses]},
        {"role": "user", "content": [
            *({"type": "tool_result", "tool_use_id": u.id, "content": "sunny, 21 C"}
              for u in uses),
            {"type": "text", "text": "So?"},
        ]},
    ]  # fmt: skip
    second = client.messages.create(
        model="", max_tokens=8, messages=history, tools=TOOLS, tool_choice={"type": "none"}
    )
    assert second.stop_reason == "max_tokens" and second.content[0].type == "text"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"messages": ASK}, "'max_tokens' is required"),
        ({"max_tokens": 4, "messages": []}, "'messages' must be a non-empty list"),
        ({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]},
         "messages[0].role: role must be 'user' or 'assistant'"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://x"}}]}]},
         "messages[0].content[0].type: content blocks of type 'image' are not supported"),
        ({"max_tokens": 4, "messages": ASK, "tools": [{"type": "web_search_20250305",
                                                       "name": "web_search"}]},
         "tools[0].type: only custom tools are supported"),
        ({"max_tokens": 4, "messages": ASK, "temperature": "hot"}, "'temperature' must be"),
        ({"max_tokens": 4, "messages": ASK, "mcp_servers": [{"url": "x"}]}, "mcp_servers"),
        ({"max_tokens": 4, "messages": ASK, "stop_sequences": "END"}, "'stop_sequences'"),
        # The worker's refusal (no tool-call parser for `auto`) in Anthropic's shape too.
        ({"max_tokens": 4, "messages": ASK, "tools": TOOLS}, "tool choice 'auto' needs"),
    ],
    ids=["no-max-tokens", "no-messages", "role", "image", "server-tool", "temperature",
         "mcp", "stop-type", "worker-auto"],
)  # fmt: skip
def test_bad_input_is_a_400_in_anthropics_shape(
    client: anthropic.Anthropic, body: dict[str, Any], says: str
) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        client.post("/v1/messages", body={"model": "", **body}, cast_to=object)
    err = info.value.body
    assert isinstance(err, dict) and set(err) == {"type", "error"} and err["type"] == "error"
    assert err["error"]["type"] == "invalid_request_error"
    assert says in err["error"]["message"]


def test_keys_by_x_api_key_or_bearer_and_a_wrong_one_in_anthropics_shape(sim: Stack) -> None:
    kw: Any = {"model": "", "max_tokens": 2, "messages": ASK}
    with anthropic.Anthropic(base_url=sim.base, auth_token=KEY, max_retries=0) as bearer:
        assert bearer.messages.create(**kw).usage.output_tokens == 2
    with anthropic.Anthropic(base_url=sim.base, api_key="wrong-key", max_retries=0) as wrong:
        with pytest.raises(anthropic.AuthenticationError) as info:
            wrong.messages.create(**kw)
        with pytest.raises(anthropic.AuthenticationError):
            wrong.messages.count_tokens(model="", messages=ASK)
    assert info.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "Incorrect API key provided."},
    }
    # The OpenAI routes keep OpenAI's shape.
    r = httpx.post(f"{sim.base}/v1/chat/completions", json={}, headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
