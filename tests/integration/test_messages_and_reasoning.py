"""Anthropic's Messages API through the official `anthropic` SDK against a real edge and a
real sim worker: whole and streamed answers (the stream helper's final message equals the
whole answer), tools forced by `any` and by name, a tool-use history, stop sequences,
count_tokens, `x-api-key` auth, and bad input in Anthropic's error shape. (On the real
SmolLM2 worker: test_model_openai.py; the golden transcripts: test_golden_streams.py.)

Reasoning output: a second sim worker behind the same edge (model "thinker") answers with
a thinking model's text (`--sim-answer`), split by vLLM's `deepseek_r1` reasoning parser
(`--reasoning-parser`): chat's `reasoning_content`, a Responses `reasoning` item, a
Messages `thinking` block, streamed and whole. SmolLM2 does not think.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.integration.edge_fixtures import Stack, parse_sse, wait_ready
from tests.procs import Proc, start_edge, start_worker, wait_serving
from tests.waits import eventually

KEY = "sk-anthropic-test-key-0123456789"
MODEL, THINKER = "sim-model", "thinker"
THOUGHT, ANSWER = " the river is long ", " Paris is the answer"
THINKING_TEXT = f"<think>{THOUGHT}</think>{ANSWER}"
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
def workers() -> Iterator[tuple[Stack, Proc]]:
    """The edge, the plain sim worker and the thinking one. The thinking worker imports
    vLLM (its reasoning parsers) as it starts: seconds, spent while the tests before its
    own run."""
    thinker = start_worker("--engine", "sim", "--served-model-name", THINKER,
                           "--reasoning-parser", "deepseek_r1", "--sim-answer", THINKING_TEXT,
                           "--sim-token-delay", "0.001", wait=False)  # fmt: skip
    plain = edge = None
    try:
        plain = start_worker("--engine", "sim", "--sim-token-delay", "0.001")
        edge = start_edge("--worker", plain.address, "--worker", thinker.address,
                          env={"SLUICE_API_KEYS": f"t:{KEY}"})  # fmt: skip
        wait_ready(f"http://{edge.address}")
        yield Stack(plain, edge), thinker
    finally:
        for proc in (edge, plain, thinker):
            if proc is not None:
                proc.kill()


@pytest.fixture(scope="module")
def sim(workers: tuple[Stack, Proc]) -> Stack:
    return workers[0]


@pytest.fixture(scope="module")
def thinking(workers: tuple[Stack, Proc]) -> Stack:
    """The stack once the thinking worker serves through the edge."""
    s, thinker = workers
    wait_serving(thinker.address, timeout=120)
    body = {"model": THINKER, "messages": [{"role": "user", "content": "Hi"}]}
    eventually(
        lambda: httpx.post(f"{s.base}/v1/messages/count_tokens", json=body,
                           headers={"x-api-key": KEY}).status_code == 200,
        what="the edge routes to the thinking worker",
    )  # fmt: skip
    return s


@pytest.fixture
def client(sim: Stack) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=sim.base, api_key=KEY, max_retries=0) as c:
        yield c


def _same(streamed: Any, whole: Any) -> None:
    """The stream helper's final message is the whole answer (message and call ids and
    signatures are per generation; the second may read part of its prompt from the sim's
    prefix cache)."""
    a, b = streamed.model_dump(), whole.model_dump()
    assert a.pop("id").startswith("msg_") and b.pop("id").startswith("msg_")
    for m in (a, b):
        m["usage"]["input_tokens"] += m["usage"].pop("cache_read_input_tokens")
        for block in m["content"]:
            if block["type"] == "tool_use":
                assert block.pop("id").startswith("call_")
            if block["type"] == "thinking":  # named after its message: per generation too
                assert len(block.pop("signature")) == 32
    assert a == b


def test_whole_and_streamed_answers_are_the_same_message(client: anthropic.Anthropic) -> None:
    turn = {"role": "user", "content": [{"type": "text", "text": "Rivers?"}]}
    kw: Any = {"model": MODEL, "max_tokens": 12, "extra_body": GREEDY, "system": "Be brief.",
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
    counted = client.messages.count_tokens(
        model=MODEL, system=kw["system"], messages=kw["messages"]
    )
    assert counted.input_tokens == whole.usage.input_tokens > 0


def test_the_raw_stream_has_anthropics_named_events(sim: Stack) -> None:
    body = {"model": MODEL, "max_tokens": 5, "temperature": 0, "stream": True,
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
    kw: Any = {"model": MODEL, "max_tokens": 30, "extra_body": GREEDY, "messages": ASK}
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
    kw: Any = {"model": MODEL, "max_tokens": 200, "extra_body": GREEDY, "messages": ASK,
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
        model=MODEL, max_tokens=8, messages=history, tools=TOOLS, tool_choice={"type": "none"}
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
        client.post("/v1/messages", body={"model": MODEL, **body}, cast_to=object)
    err = info.value.body
    assert isinstance(err, dict) and set(err) == {"type", "error"} and err["type"] == "error"
    assert err["error"]["type"] == "invalid_request_error"
    assert says in err["error"]["message"]


def test_keys_by_x_api_key_or_bearer_and_a_wrong_one_in_anthropics_shape(sim: Stack) -> None:
    kw: Any = {"model": MODEL, "max_tokens": 2, "messages": ASK}
    with anthropic.Anthropic(base_url=sim.base, auth_token=KEY, max_retries=0) as bearer:
        assert bearer.messages.create(**kw).usage.output_tokens == 2
    with anthropic.Anthropic(base_url=sim.base, api_key="wrong-key", max_retries=0) as wrong:
        with pytest.raises(anthropic.AuthenticationError) as info:
            wrong.messages.create(**kw)
        with pytest.raises(anthropic.AuthenticationError):
            wrong.messages.count_tokens(model=MODEL, messages=ASK)
    assert info.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "Incorrect API key provided."},
    }
    # The OpenAI routes keep OpenAI's shape.
    r = httpx.post(f"{sim.base}/v1/chat/completions", json={}, headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


# -- reasoning output (the thinking worker) -------------------------------------------


def test_chat_has_reasoning_content_streamed_and_whole(thinking: Stack) -> None:
    kw: Any = {"model": THINKER, "messages": ASK}
    with openai.OpenAI(base_url=f"{thinking.base}/v1", api_key=KEY, max_retries=0) as c:
        message = c.chat.completions.create(**kw).choices[0].message
        chunks = list(c.chat.completions.create(**kw, stream=True))
    assert (message.model_extra or {}).get("reasoning_content") == THOUGHT
    assert message.content == ANSWER
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    thought = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert (thought, "".join(d.content or "" for d in deltas)) == (THOUGHT, ANSWER)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_responses_have_a_reasoning_item_streamed_and_whole(thinking: Stack) -> None:
    with openai.OpenAI(base_url=f"{thinking.base}/v1", api_key=KEY, max_retries=0) as c:
        whole = c.responses.create(model=THINKER, input="Rivers?")
        events = list(c.responses.create(model=THINKER, input="Rivers?", stream=True))
    items = [i.model_dump(exclude_none=True) for i in whole.output]
    assert [i["type"] for i in items] == ["reasoning", "message"]
    assert items[0]["content"] == [{"type": "reasoning_text", "text": THOUGHT}]
    assert items[0]["summary"] == [] and items[0]["id"].startswith("rs_")
    assert whole.output_text == ANSWER
    kinds = [e.type for e in events]
    assert kinds[2:4] == ["response.output_item.added", "response.reasoning_text.delta"]
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")  # type: ignore[union-attr]
    assert thought == THOUGHT
    done = [e for e in events if e.type == "response.reasoning_text.done"]
    assert [e.text for e in done] == [THOUGHT]  # type: ignore[union-attr]
    final = events[-1].response  # type: ignore[union-attr]
    assert [i.model_dump(exclude={"id"}) for i in final.output] == [
        i.model_dump(exclude={"id"}) for i in whole.output
    ]


def test_messages_have_a_thinking_block_streamed_and_whole(thinking: Stack) -> None:
    kw: Any = {"model": THINKER, "max_tokens": 64, "messages": ASK}
    with anthropic.Anthropic(base_url=thinking.base, api_key=KEY, max_retries=0) as c:
        whole = c.messages.create(**kw)
        with c.messages.stream(**kw) as stream:
            streamed = stream.get_final_message()
    think, text = whole.content
    assert think.type == "thinking" and think.thinking == THOUGHT and think.signature
    assert text.type == "text" and text.text == ANSWER and whole.stop_reason == "end_turn"
    _same(streamed, whole)
    # The thinking block goes back in the next turn's history and is left out of it.
    again = [*ASK, {"role": "assistant", "content": [b.model_dump() for b in whole.content]},
             {"role": "user", "content": "And?"}]  # fmt: skip
    body = {"model": THINKER, "messages": again}
    r = httpx.post(f"{thinking.base}/v1/messages/count_tokens", json=body,
                   headers={"x-api-key": KEY})  # fmt: skip
    plain = [*ASK, {"role": "assistant", "content": ANSWER}, {"role": "user", "content": "And?"}]
    r2 = httpx.post(f"{thinking.base}/v1/messages/count_tokens",
                    json={**body, "messages": plain}, headers={"x-api-key": KEY})  # fmt: skip
    assert r.status_code == 200 and r.json() == r2.json()
