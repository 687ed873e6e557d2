"""What today's OpenAI apps send, through the official `openai` SDK against a real edge and
a real sim worker: structured outputs, tools, n > 1, the Responses API, and exact resumes
in the middle of each of those streams. (The same through the real SmolLM2 worker:
test_model_openai.py; the simulated engine writes a valid instance of a schema where vLLM
samples under it.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel

from generated import sluice_pb2 as pb
from model_service.client import SluiceClient
from tests.integration.edge_fixtures import CODEC, Stack, parse_sse, stack, streamed_tool_calls

WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "get_time"}},
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


class City(BaseModel):
    name: str
    population: int
    districts: list[str]


@pytest.fixture(scope="module")
def sim() -> Iterator[Stack]:
    # The generation goes on while a client is away, so a resume picks it up live.
    with stack(("--sim-token-delay", "0.002"), ("--openai-detach-grace", "10")) as s:
        yield s


@pytest.fixture
def client(sim: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{sim.base}/v1", api_key="none", max_retries=0) as c:
        yield c


# -- structured outputs ---------------------------------------------------------------


def test_parse_with_a_pydantic_model_streamed_and_not(client: openai.OpenAI) -> None:
    whole = client.beta.chat.completions.parse(model="", messages=ASK, response_format=City)
    assert isinstance(whole.choices[0].message.parsed, City)
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "City", "schema": to_strict_json_schema(City), "strict": True},
    }
    stream = client.chat.completions.create(
        model="",
        messages=ASK,
        response_format=fmt,
        stream=True,
        seed=3,  # type: ignore[arg-type]
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    City.model_validate_json(text)


def test_json_schema_and_json_object_validate(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    for stream in (False, True):
        got = client.chat.completions.create(
            model="", messages=ASK, response_format=fmt, stream=stream
        )
        text = (
            "".join(c.choices[0].delta.content or "" for c in got if c.choices)  # type: ignore[union-attr]
            if stream
            else got.choices[0].message.content  # type: ignore[union-attr]
        )
        jsonschema.validate(json.loads(text or ""), schema)
    obj = client.chat.completions.create(
        model="", messages=ASK, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(obj.choices[0].message.content or ""), dict)


# -- tools ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_forced_tool_calls_validate_streamed_and_not_and_a_second_turn_follows(
    client: openai.OpenAI, choice: Any
) -> None:
    whole = client.chat.completions.create(
        model="",
        messages=ASK,
        tools=TOOLS,
        tool_choice=choice,
        seed=11,  # type: ignore[arg-type]
    )
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls
    calls = [
        {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}  # type: ignore[union-attr]
        for c in message.tool_calls
    ]
    streamed, reason = streamed_tool_calls(
        client.chat.completions.create(
            model="",
            messages=ASK,
            tools=TOOLS,
            tool_choice=choice,
            seed=11,
            stream=True,  # type: ignore[arg-type]
        )
    )
    assert reason == "tool_calls"
    # Same seed, same calls (ids are per generation).
    assert [(c["name"], c["arguments"]) for c in streamed] == [
        (c["name"], c["arguments"]) for c in calls
    ]
    for call in calls:
        assert call["id"].startswith("call_")
        if call["name"] == "get_weather":
            jsonschema.validate(json.loads(call["arguments"]), WEATHER_PARAMS)
    history: list[Any] = [
        *ASK,
        message.model_dump(exclude_none=True),
        *({"role": "tool", "tool_call_id": c["id"], "content": "sunny, 21 C"} for c in calls),
    ]
    second = client.chat.completions.create(
        model="", messages=history, tools=TOOLS, tool_choice="none"
    )
    assert second.choices[0].message.content  # the answer, in text


def test_tool_choice_none_keeps_tools_out_of_the_output(client: openai.OpenAI) -> None:
    got = client.chat.completions.create(model="", messages=ASK, tools=TOOLS, tool_choice="none")
    assert got.choices[0].finish_reason in ("stop", "length")
    assert got.choices[0].message.tool_calls is None and got.choices[0].message.content


def test_auto_without_a_parser_is_a_400_naming_tool_choice(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="", messages=ASK, tools=TOOLS)
    assert info.value.param == "tool_choice"
    assert "tool-call-parser" in info.value.message


# -- n > 1 ------------------------------------------------------------------------------


def test_n3_seeded_choices_are_reproducible_streamed_and_not(client: openai.OpenAI) -> None:
    kw: Any = {"model": "", "messages": ASK, "n": 3, "seed": 7, "max_tokens": 12}
    first, again = (client.chat.completions.create(**kw) for _ in range(2))
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in again.choices]
    assert len(set(texts)) == 3  # seed + i: three different draws
    assert first.usage is not None and first.usage.completion_tokens == 36
    streamed: dict[int, str] = {0: "", 1: "", 2: ""}
    finished = {}
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished[c.index] = c.finish_reason
    assert [streamed[i] for i in range(3)] == texts
    assert finished == {0: "length", 1: "length", 2: "length"}


# -- the Responses API ----------------------------------------------------------------


def test_responses_stream_ends_completed_with_the_whole_responses_text(
    client: openai.OpenAI,
) -> None:
    kw: Any = {"model": "", "input": "Tell me about rivers.", "instructions": "Be brief."}
    whole = client.responses.create(**kw, temperature=0)
    assert whole.status == "completed" and whole.output_text
    events = list(client.responses.create(**kw, temperature=0, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert deltas == final.output_text == whole.output_text
    assert final.usage is not None and final.usage.output_tokens == whole.usage.output_tokens  # type: ignore[union-attr]
    capped = client.responses.create(**kw, max_output_tokens=3)
    assert capped.status == "incomplete" and capped.incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]


def test_responses_structured_output_and_function_call(client: openai.OpenAI) -> None:
    fmt: Any = {
        "format": {"type": "json_schema", "name": "City", "schema": City.model_json_schema()}
    }
    got = client.responses.create(model="", input="A city, please.", text=fmt)
    City.model_validate_json(got.output_text)
    tools: Any = [{"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMS}]
    events = list(
        client.responses.create(
            model="", input="Weather?", tools=tools, tool_choice="required", stream=True
        )
    )
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1
    jsonschema.validate(json.loads(done[0].arguments), WEATHER_PARAMS)
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == done[0].arguments
    call = events[-1].response.output[0]  # type: ignore[union-attr]
    assert call.type == "function_call" and call.name == "get_weather"  # type: ignore[union-attr]
    second = client.responses.create(
        model="",
        input=[
            {"role": "user", "content": "Weather?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": "get_weather",  # type: ignore[union-attr]
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ],
        tools=tools,
        tool_choice="none",
    )
    assert second.status == "completed" and second.output_text


def test_responses_continue_only_from_a_kept_one(client: openai.OpenAI) -> None:
    """(Stored responses across replicas: test_responses_store.py.)"""
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="", input="hi", previous_response_id="resp_1")
    assert info.value.param == "previous_response_id"  # type: ignore[attr-defined]
    kept = client.responses.create(model="", input="hi", store=True, max_output_tokens=4)
    assert kept.store is True and client.responses.retrieve(kept.id).id == kept.id


def test_responses_history_with_reasoning_items_is_served_as_without_them(
    client: openai.OpenAI,
) -> None:
    """A conversation continued from OpenAI carries `reasoning` items: checked, left out
    of the prompt (greedy answers equal); a malformed one is a 400 naming its field."""
    turn: Any = [
        {"role": "user", "content": "Name a river."},
        {"role": "assistant", "content": "The Nile."},
        {"role": "user", "content": "Another?"},
    ]
    reasoning: Any = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "The user wants a river."}],
        "encrypted_content": "opaque",
    }
    kw: Any = {"model": "", "temperature": 0, "max_output_tokens": 12}
    plain = client.responses.create(input=turn, **kw)
    mixed = client.responses.create(input=[turn[0], reasoning, *turn[1:]], **kw)
    # The second asks over a cached prefix: counts equal, cached tokens differ.
    assert [(r.output_text, r.usage.input_tokens, r.usage.output_tokens) for r in (mixed,)] == [
        (plain.output_text, plain.usage.input_tokens, plain.usage.output_tokens)
    ]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(input=[{**reasoning, "summary": "text"}, *turn], **kw)
    assert info.value.param == "input[0].summary"


def extra(obj: Any) -> dict[str, Any]:
    """The fields the SDK's models do not declare (vLLM's extensions)."""
    return obj.model_extra or {}


def _rendered(sim: Stack, path: str, body: dict[str, Any]) -> list[int]:
    got = httpx.post(f"{sim.base}/v1/{path}/render", json=body, timeout=10).json()
    return list((got if isinstance(got, dict) else got[0])["token_ids"])


def test_return_token_ids_streamed_and_not_as_vllm_lays_them_out(
    client: openai.OpenAI, sim: Stack
) -> None:
    """vLLM's `return_token_ids`: chat puts `prompt_token_ids` on the response (streamed:
    the first chunk) and `token_ids` on each choice (each chunk); completions put both on
    each choice (streamed: prompt ids on each choice's first chunk). The prompt ids are
    the render endpoint's, a choice's ids as many as its completion tokens, the streamed
    ids the whole answer's; without it, the whole answers carry them null."""
    kw: Any = {"model": "", "max_tokens": 6, "seed": 5, "extra_body": {"return_token_ids": True}}
    prompt = _rendered(sim, "chat/completions", {"messages": ASK})
    chat = client.chat.completions.create(messages=ASK, n=2, **kw)
    assert extra(chat)["prompt_token_ids"] == prompt
    ids = [extra(c)["token_ids"] for c in chat.choices]
    assert sum(map(len, ids)) == chat.usage.completion_tokens
    chunks = list(client.chat.completions.create(messages=ASK, n=2, stream=True, **kw))
    assert [extra(c).get("prompt_token_ids") for c in chunks[:1]] == [prompt]
    assert all("prompt_token_ids" not in extra(c) for c in chunks[1:])
    streamed: dict[int, list[int]] = {0: [], 1: []}
    for c in chunks:
        for ch in c.choices:
            streamed[ch.index] += extra(ch).get("token_ids") or []
    assert [streamed[0], streamed[1]] == ids

    text = "The rivers of France"
    comp = client.completions.create(prompt=text, n=2, **kw)
    text_ids = _rendered(sim, "completions", {"prompt": text})
    assert [extra(c)["prompt_token_ids"] for c in comp.choices] == [text_ids, text_ids]
    cids = [extra(c)["token_ids"] for c in comp.choices]
    assert sum(map(len, cids)) == comp.usage.completion_tokens
    firsts: dict[int, list[Any]] = {0: [], 1: []}
    got: dict[int, list[int]] = {0: [], 1: []}
    for c in client.completions.create(prompt=text, n=2, stream=True, **kw):
        for ch in c.choices:
            firsts[ch.index].append(extra(ch).get("prompt_token_ids"))
            got[ch.index] += extra(ch).get("token_ids") or []
    assert [f[0] for f in firsts.values()] == [text_ids, text_ids]
    assert not any(any(f[1:]) for f in firsts.values())
    assert [got[0], got[1]] == cids

    plain = client.chat.completions.create(messages=ASK, model="", max_tokens=2)
    assert (extra(plain)["prompt_token_ids"], extra(plain.choices[0])["token_ids"]) == (None, None)


# -- exact resume in the middle of each shape -------------------------------------------

RESUME_CASES = {
    "tool call": (
        "/v1/chat/completions",
        {
            "messages": ASK,
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
    ),
    "n=3": ("/v1/chat/completions", {"messages": ASK, "n": 3, "max_tokens": 20}),
    "token-id prompt": ("/v1/completions", {"prompt": [5, 17, 3, 40], "max_tokens": 20}),
    "usage per chunk": (
        "/v1/chat/completions",
        {
            "messages": ASK,
            "max_tokens": 20,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    ),
    "responses": ("/v1/responses", {"input": "Tell me about rivers.", "max_output_tokens": 30}),
    "responses tool call": (
        "/v1/responses",
        {
            "input": "Weather?",
            "tool_choice": "required",
            "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMS}],
        },
    ),
    # Anthropic's Messages API (its events depend on all before them, as the Responses API's).
    "messages": ("/v1/messages", {"messages": ASK, "max_tokens": 30}),
    "messages tool use": (
        "/v1/messages",
        {
            "messages": ASK,
            "max_tokens": 200,
            "tool_choice": {"type": "any"},
            "tools": [{"name": "get_weather", "input_schema": WEATHER_PARAMS}],
        },
    ),
}


def _events(raw: bytes) -> list[dict[str, str]]:
    """Data events with their id and name (each response opens with its own `retry:`)."""
    return [{k: v for k, v in e.items() if k != "retry"} for e in parse_sse(raw) if "data" in e]


@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_a_resume_mid_stream_is_exact(sim: Stack, case: str) -> None:
    path, body = RESUME_CASES[case]
    body = {**body, "stream": True, "temperature": 0.9}
    url = f"{sim.base}{path}"
    with httpx.Client(timeout=30) as http:
        # The first connection reads a few events and goes away mid-stream.
        first: list[dict[str, str]] = []
        with http.stream("POST", url, json=body) as resp:
            assert resp.status_code == 200
            buf = b""
            for part in resp.iter_bytes():
                buf += part
                first = _events(buf.rsplit(b"\n\n", 1)[0] + b"\n\n")
                if len(first) >= 6:
                    break
        cut = first[:6]
        tail = _events(http.post(url, json=body, headers={"Last-Event-ID": cut[-1]["id"]}).read())
        # The same generation in one piece: everything after its first event.
        whole = cut[:1] + _events(
            http.post(url, json=body, headers={"Last-Event-ID": cut[0]["id"]}).read()
        )
    assert cut + tail == whole  # ids, event names and data, byte for byte
    points = [CODEC.parse(e["id"]) for e in whole]
    assert [p.seq for p in points] == list(range(len(whole)))
    last = whole[-1]
    assert last["data"] == "[DONE]" or last["event"] in (
        "response.completed",
        "response.incomplete",
        "message_stop",
    )


# -- the same over gRPC -----------------------------------------------------------------


async def test_constraints_over_grpc_with_the_python_client(sim: Stack) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    weather = pb.Tool(name="get_weather", parameters_json=json.dumps(WEATHER_PARAMS))
    async with SluiceClient(sim.worker.address) as client:
        gen = client.generate(
            messages=[("user", "hi")],
            structured_output=pb.StructuredOutput(json_schema=json.dumps(schema)),
        )
        jsonschema.validate(json.loads(await gen.text()), schema)
        gen = client.generate(
            messages=[("user", "hi")],
            tools=[weather],
            tool_choice=pb.ToolChoice(mode=pb.TOOL_MODE_REQUIRED),
        )
        calls = [t async for chunk in gen for t in chunk.tool_calls]
        assert gen.final is not None and gen.final.reason == pb.FINISH_REASON_TOOL_CALLS
        assert calls and calls[0].name == "get_weather" and calls[0].id.startswith("call_")
        jsonschema.validate(json.loads("".join(c.arguments for c in calls)), WEATHER_PARAMS)
        gen = client.generate(prompt="hi", n=2, seed=1, max_tokens=4)
        by_choice: dict[int, int] = {}
        async for chunk in gen:
            by_choice[chunk.choice] = by_choice.get(chunk.choice, 0) + len(chunk.token_ids)
        assert by_choice == {0: 4, 1: 4}
        assert gen.final is not None and [c.completion_tokens for c in gen.final.choices] == [4, 4]
        assert gen.final.usage.completion_tokens == 8


def test_the_sdks_stream_helpers_read_our_separate_finish_chunk(client: openai.OpenAI) -> None:
    """OpenAI's layout (the finish reason on an empty-delta chunk of its own, vLLM puts it
    on the last token's) is what the SDK's stream helpers assemble: their final completion
    equals the whole answer, text, finish reason and token counts."""
    kw: Any = {"model": "", "messages": ASK, "max_tokens": 400, "seed": 11}
    whole = client.chat.completions.create(**kw)
    with client.chat.completions.stream(**kw, stream_options={"include_usage": True}) as s:
        texts = [e.delta for e in s if e.type == "content.delta"]
        final = s.get_final_completion()

    def seen(text: str, c: Any) -> tuple[Any, ...]:
        u = c.usage
        return text, c.choices[0].finish_reason, u.prompt_tokens, u.completion_tokens

    assert seen("".join(texts), final) == seen(whole.choices[0].message.content or "", whole)
    assert final.choices[0].message.content == whole.choices[0].message.content
