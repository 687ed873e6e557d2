"""The OpenAI surface against the real engine: the official `openai` SDK through a real
edge to the session's vLLM worker (SmolLM2-135M-Instruct, `--tool-call-parser hermes`),
and the same constraints over gRPC with `SluiceClient`; Anthropic's Messages API through
the official `anthropic` SDK on the same edge.

SmolLM2's chat template knows no tools, so what makes a tool call here is the grammar:
`required` and a named function sample under the calls' JSON schema, and `auto` is shown
with an output forced (by a regex) into the Hermes format that the parser must find.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from generated import sluice_pb2 as pb
from model_service.client import SluiceClient
from tests.integration.conftest import _make_model
from tests.integration.edge_fixtures import EDGE_ENV, streamed_tool_calls, wait_ready
from tests.procs import Proc, start_edge

pytestmark = pytest.mark.model

FRANCE = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
WEATHER_Q = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"],
}
TOOLS: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
HERMES_CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n'
    "</tool_call>"
)


class Capital(BaseModel):
    city: str
    country: str


@pytest.fixture(scope="module")
def edge(vllm_worker: Proc) -> Iterator[Proc]:
    e = start_edge("--worker", vllm_worker.address, env=EDGE_ENV)
    try:
        wait_ready(f"http://{e.address}", timeout=30)
        yield e
    finally:
        e.kill()


@pytest.fixture(scope="module")
def client(edge: Proc) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"http://{edge.address}/v1", api_key="none", max_retries=0, timeout=120
    ) as c:
        yield c


def _text(stream: Any) -> str:
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_parse_with_a_pydantic_model_and_a_raw_schema_streamed_and_not(
    client: openai.OpenAI,
) -> None:
    kw: Any = {"model": "", "messages": FRANCE, "temperature": 0, "max_tokens": 80}
    parsed = client.beta.chat.completions.parse(**kw, response_format=Capital)
    answer = parsed.choices[0].message.parsed
    assert isinstance(answer, Capital) and "paris" in answer.city.lower()
    schema = Capital.model_json_schema()
    fmt = {"type": "json_schema", "json_schema": {"name": "Capital", "schema": schema}}
    whole = client.chat.completions.create(**kw, response_format=fmt)
    text = whole.choices[0].message.content or ""
    jsonschema.validate(json.loads(text), schema)
    assert _text(client.chat.completions.create(**kw, response_format=fmt, stream=True)) == text


def test_json_object_is_parseable_json(client: openai.OpenAI) -> None:
    got = client.chat.completions.create(
        model="", messages=FRANCE, response_format={"type": "json_object"}, temperature=0,
        max_tokens=80,
    )  # fmt: skip
    assert got.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(got.choices[0].message.content or ""), dict)


def test_a_schema_the_backend_cannot_compile_is_a_400_and_the_worker_serves_on(
    client: openai.OpenAI,
) -> None:
    for bad in (
        {"type": "string", "pattern": "(("},
        {"type": "integer", "minimum": 5, "maximum": 1},
    ):
        fmt: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": bad}}
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="", messages=FRANCE, response_format=fmt)
        assert info.value.param == "response_format.json_schema"
        assert "Grammar error" in info.value.message
    ok = client.chat.completions.create(model="", messages=FRANCE, max_tokens=3)
    assert ok.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_forced_tool_calls_validate_streamed_and_not_and_the_tool_result_is_accepted(
    client: openai.OpenAI, choice: Any
) -> None:
    kw: Any = {
        "model": "",
        "messages": WEATHER_Q,
        "tools": TOOLS,
        "tool_choice": choice,
        "temperature": 0,
        "max_tokens": 120,
    }
    whole = client.chat.completions.create(**kw)
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls" and message.tool_calls
    calls = [
        {"name": c.function.name, "arguments": c.function.arguments}  # type: ignore[union-attr]
        for c in message.tool_calls
    ]
    for call in calls:
        assert call["name"] == "get_weather"
        jsonschema.validate(json.loads(call["arguments"]), WEATHER)
    streamed, reason = streamed_tool_calls(client.chat.completions.create(**kw, stream=True))
    assert reason == "tool_calls"  # greedy: the same calls
    assert [{"name": c["name"], "arguments": c["arguments"]} for c in streamed] == calls
    history: Any = [
        *WEATHER_Q,
        message.model_dump(exclude_none=True),
        *(
            {"role": "tool", "tool_call_id": c.id, "content": '{"temp": 21}'}
            for c in message.tool_calls
        ),
    ]
    second = client.chat.completions.create(
        model="", messages=history, tools=TOOLS, tool_choice="none", max_tokens=20
    )
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls


def test_anthropic_messages_create_and_stream_with_a_tool_on_vllm(edge: Proc) -> None:
    """`messages.create` and `messages.stream` (greedy): the same tool_use block, its input
    valid for the tool's schema; the tool's result answered in text; count_tokens counts
    what the generation prefilled."""
    tools: Any = [{"name": "get_weather", "description": "The weather", "input_schema": WEATHER}]
    kw: Any = {"model": "", "max_tokens": 120, "messages": WEATHER_Q, "tools": tools,
               "tool_choice": {"type": "tool", "name": "get_weather"},
               "extra_body": {"temperature": 0}}  # fmt: skip
    base = f"http://{edge.address}"
    with anthropic.Anthropic(base_url=base, api_key="none", max_retries=0, timeout=120) as c:
        whole = c.messages.create(**kw)
        with c.messages.stream(**kw) as stream:
            streamed = stream.get_final_message()
        counted = c.messages.count_tokens(model="", messages=WEATHER_Q, tools=tools)
        [use] = whole.content
        assert whole.stop_reason == "tool_use" and use.type == "tool_use"
        assert use.name == "get_weather"
        jsonschema.validate(use.input, WEATHER)
        [got] = streamed.content
        assert streamed.stop_reason == "tool_use" and got.type == "tool_use"
        assert (got.name, got.input) == (use.name, use.input)
        assert streamed.usage.output_tokens == whole.usage.output_tokens
        usage = whole.usage
        assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)
        history: Any = [
            *WEATHER_Q,
            {"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": '{"temp": 21}'}]},
        ]  # fmt: skip
        second = c.messages.create(model="", max_tokens=16, messages=history, tools=tools,
                                   tool_choice={"type": "none"})  # fmt: skip
    assert second.content[0].type == "text" and second.content[0].text


def test_auto_with_the_hermes_parser_finds_the_call_in_the_output(
    client: openai.OpenAI,
) -> None:
    # The output is forced into a Hermes call; the parser must turn it into tool_calls.
    kw: Any = {
        "model": "",
        "messages": WEATHER_Q,
        "tools": TOOLS,
        "temperature": 0,
        "max_tokens": 150,  # forced text tokenizes finely: ~60 tokens
        "extra_body": {"structured_outputs": {"regex": re.escape(HERMES_CALL)}},
    }
    whole = client.chat.completions.create(**kw)
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls"
    assert message.content is None and message.tool_calls is not None
    [call] = message.tool_calls
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "C"}  # type: ignore[union-attr]
    streamed, reason = streamed_tool_calls(client.chat.completions.create(**kw, stream=True))
    assert reason == "tool_calls" and len(streamed) == 1
    assert json.loads(streamed[0]["arguments"]) == {"city": "Paris", "unit": "C"}


def test_n3_with_a_seed_gives_three_reproducible_choices_streamed_and_not(
    client: openai.OpenAI,
) -> None:
    kw: Any = {"model": "", "messages": FRANCE, "n": 3, "seed": 4, "max_tokens": 8}
    first, again = (client.chat.completions.create(**kw) for _ in range(2))
    texts = [c.message.content for c in first.choices]
    assert len(texts) == 3 and texts == [c.message.content for c in again.choices]
    assert first.usage is not None and first.usage.completion_tokens == 24
    streamed = {0: "", 1: "", 2: ""}
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
    assert [streamed[i] for i in range(3)] == texts


def test_the_rest_of_the_sampling_surface_reaches_vllm(client: openai.OpenAI) -> None:
    comma = 28  # SmolLM2's token for ","
    biased = client.chat.completions.create(
        model="", messages=FRANCE, temperature=0, max_tokens=4, logit_bias={str(comma): 100}
    )
    assert biased.choices[0].message.content == ",,,,"
    stopped = client.chat.completions.create(
        model="", messages=FRANCE, temperature=0, max_tokens=40,
        response_format={"type": "json_object"},
        extra_body={"stop_token_ids": [comma], "min_p": 0.1, "repetition_penalty": 1.1},
    )  # fmt: skip
    assert stopped.choices[0].finish_reason == "stop"
    assert "," not in (stopped.choices[0].message.content or "")
    stream = client.chat.completions.create(
        model="", messages=FRANCE, max_tokens=5, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )  # fmt: skip
    counts = [c.usage.completion_tokens for c in stream if c.usage is not None]
    assert counts == sorted(counts) and counts[-1] == 5


def test_responses_stream_equals_the_whole_response_and_takes_constraints(
    client: openai.OpenAI,
) -> None:
    kw: Any = {"model": "", "input": "Name a river in France.", "temperature": 0,
               "max_output_tokens": 24}  # fmt: skip
    whole = client.responses.create(**kw)
    events = list(client.responses.create(**kw, stream=True))
    assert events[0].type == "response.created"
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert events[-1].response.output_text == whole.output_text  # type: ignore[union-attr]
    assert whole.output_text
    fmt: Any = {"format": {"type": "json_schema", "name": "Capital",
                           "schema": Capital.model_json_schema()}}  # fmt: skip
    structured = client.responses.create(
        model="", input=FRANCE[0]["content"], text=fmt, temperature=0, max_output_tokens=80
    )
    Capital.model_validate_json(structured.output_text)
    tools: Any = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    call = client.responses.create(
        model="", input=WEATHER_Q[0]["content"], tools=tools, tool_choice="required",
        temperature=0, max_output_tokens=120,
    ).output[0]  # fmt: skip
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER)


async def test_the_same_constraints_over_grpc(vllm_worker: Proc) -> None:
    tool = pb.Tool(name="get_weather", parameters_json=json.dumps(WEATHER))
    async with SluiceClient(vllm_worker.address) as c:
        gen = c.generate(
            messages=[("user", FRANCE[0]["content"])],
            structured_output=pb.StructuredOutput(json_schema=json.dumps(WEATHER)),
            temperature=0,
            max_tokens=60,
        )
        jsonschema.validate(json.loads(await gen.text()), WEATHER)
        gen = c.generate(
            messages=[("user", "Yes or no?")],
            structured_output=pb.StructuredOutput(choice=pb.ChoiceList(choices=["yes", "no"])),
            max_tokens=5,
        )
        assert await gen.text() in ("yes", "no")
        gen = c.generate(
            messages=[("user", WEATHER_Q[0]["content"])],
            tools=[tool],
            tool_choice=pb.ToolChoice(mode=pb.TOOL_MODE_AUTO),
            structured_output=pb.StructuredOutput(regex=re.escape(HERMES_CALL)),
            temperature=0,
            max_tokens=150,
        )
        deltas = [d async for chunk in gen for d in chunk.tool_calls]
        assert gen.final is not None and gen.final.reason == pb.FINISH_REASON_TOOL_CALLS
        assert deltas[0].name == "get_weather" and deltas[0].id.startswith("call_")
        args = json.loads("".join(d.arguments for d in deltas))
        assert args == {"city": "Paris", "unit": "C"}


def test_every_priority_class_runs_on_vllm_priority_scheduling(client: openai.OpenAI) -> None:
    """vLLM runs with `scheduling_policy="priority"`: each class reaches it (as 0, 1, 2)
    and, at temperature 0, gets the same answer; the edge says which class it used."""
    kw: Any = {"model": "", "messages": FRANCE, "temperature": 0, "max_tokens": 12}
    answers = {}
    for tier, header in [("priority", "high"), ("default", "normal"), ("flex", "low")]:
        raw = client.chat.completions.with_raw_response.create(**kw, service_tier=tier)
        assert raw.headers["x-sluice-priority"] == header
        answers[header] = raw.parse().choices[0].message.content
    assert answers["high"] and answers["high"] == answers["normal"] == answers["low"]


async def test_a_prompt_as_token_ids_answers_as_its_text(
    client: openai.OpenAI, vllm_worker: Proc
) -> None:
    """Completions' token-id prompt forms (`[ids]`, `[[ids]]`) give vLLM exactly the text
    prompt's tokens: the same greedy answer and usage, streamed and not; an id outside the
    vocabulary is a 400 naming `prompt`."""
    text = "The capital of France is"
    async with SluiceClient(vllm_worker.address) as grpc_client:
        ids = await grpc_client.tokenize(prompt=text)
    kw: dict[str, Any] = dict(model="", max_tokens=12, temperature=0)
    by_text = client.completions.create(prompt=text, **kw)
    for prompt in (ids, [ids]):
        by_ids = client.completions.create(prompt=prompt, **kw)
        assert by_ids.choices[0].text == by_text.choices[0].text
        assert by_ids.usage == by_text.usage
    stream = client.completions.create(prompt=ids, stream=True, **kw)
    assert "".join(c.choices[0].text for c in stream if c.choices) == by_text.choices[0].text
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(prompt=[*ids, 10**9], **kw)
    assert isinstance(err.value.body, dict) and err.value.body.get("param") == "prompt"
    assert "vocabulary" in str(err.value.body.get("message"))


RIVER = [{"role": "user", "content": "Name a river."}]
PREFILL = [*RIVER, {"role": "assistant", "content": "The river"}]


def _rendered(edge: Proc, body: dict[str, Any]) -> list[int]:
    resp = httpx.post(f"http://{edge.address}/v1/chat/completions/render", json=body, timeout=30)
    assert resp.status_code == 200, resp.text
    return list(resp.json()["token_ids"])


def test_chat_template_controls_render_as_transformers_does_and_answer_so(
    client: openai.OpenAI, edge: Proc
) -> None:
    """vLLM's chat-template controls through the SDK on SmolLM2: each renders the ids
    transformers' `apply_chat_template` gives for it (documents and template variables
    reach a template that ignores them); the greedy answer of a prefill equals the
    completion of its rendered ids; `echo` puts the prefill before the reply (streamed and
    not); without a generation prompt the reply takes the final message's role."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(_make_model()))

    def ids(messages: Any, **kw: Any) -> list[int]:
        text = tok.apply_chat_template(messages, tokenize=False, **kw)
        return list(tok.encode(text, add_special_tokens=False))

    cases: list[tuple[dict[str, Any], list[int]]] = [
        ({"messages": PREFILL, "add_generation_prompt": False, "continue_final_message": True},
         ids(PREFILL, continue_final_message=True)),
        ({"messages": PREFILL, "add_generation_prompt": False}, ids(PREFILL)),
        ({"messages": RIVER, "documents": [{"title": "t", "text": "x"}],
          "chat_template_kwargs": {"enable_thinking": False}},
         ids(RIVER, add_generation_prompt=True)),
    ]  # fmt: skip
    assert [_rendered(edge, body) for body, _ in cases] == [want for _, want in cases]
    prefill: Any = {"add_generation_prompt": False, "continue_final_message": True}
    kw: dict[str, Any] = dict(model="", max_tokens=8, temperature=0)
    answer = client.chat.completions.create(messages=PREFILL, extra_body=prefill, **kw)
    plain = client.completions.create(prompt=cases[0][1], **kw)
    assert answer.choices[0].message.content == plain.choices[0].text
    echoed = client.chat.completions.create(
        messages=PREFILL, extra_body={**prefill, "echo": True}, **kw
    )
    stream = client.chat.completions.create(
        messages=PREFILL, extra_body={**prefill, "echo": True}, stream=True, **kw
    )
    want = "The river" + plain.choices[0].text
    assert [echoed.choices[0].message.content, _text(stream)] == [want, want]
    user_turn = client.chat.completions.create(
        messages=RIVER, extra_body={"add_generation_prompt": False}, **kw
    )
    assert user_turn.choices[0].message.role == "user"
    for body, param in (
        ({"continue_final_message": True}, "continue_final_message"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(messages=PREFILL, extra_body=body, **kw)
        assert isinstance(err.value.body, dict) and err.value.body.get("param") == param


def test_return_token_ids_are_the_engines(client: openai.OpenAI) -> None:
    """On SmolLM2: the prompt ids are transformers' rendering of the chat, the choice's
    ids decode to its text, streamed ids equal the whole answer's."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(_make_model()))
    text = tok.apply_chat_template(RIVER, tokenize=False, add_generation_prompt=True)
    kw: Any = dict(model="", max_tokens=8, temperature=0, extra_body={"return_token_ids": True})
    whole = client.chat.completions.create(messages=RIVER, **kw)
    extra, choice = whole.model_extra or {}, whole.choices[0]
    ids = (choice.model_extra or {})["token_ids"]
    assert extra["prompt_token_ids"] == tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == choice.message.content
    streamed = [
        i
        for c in client.chat.completions.create(messages=RIVER, stream=True, **kw)
        for ch in c.choices
        for i in (ch.model_extra or {}).get("token_ids") or []
    ]
    assert streamed == ids


def test_prompt_logprobs_and_echo_are_the_engines(client: openai.OpenAI) -> None:
    """On SmolLM2, vLLM's layout: one entry per prompt token (null first), each keyed
    by the prompt's own id first (its rank, its decoded text) then the top alternatives
    ranked 1..k; completions `echo` with `logprobs` gives the prompt's tokens with the
    same logprobs, then the same answer as without echo."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(_make_model()))
    prompt = "The capital of France is"
    ids = tok.encode(prompt)
    kw: Any = dict(model="", prompt=prompt, max_tokens=4, temperature=0)
    comp = client.completions.create(**kw, extra_body={"prompt_logprobs": 2})
    lps = (comp.choices[0].model_extra or {})["prompt_logprobs"]
    assert len(lps) == len(ids) and lps[0] is None
    for pos, entry in zip(ids[1:], lps[1:], strict=True):
        keys = list(entry)
        assert keys[0] == str(pos)
        assert entry[keys[0]]["decoded_token"] == tok.decode([pos])
        ranks = [e["rank"] for e in entry.values()]
        assert sorted(r for r in ranks if r <= 2) == [1, 2]
        assert len(entry) == 2 + (ranks[0] > 2)
        assert all(isinstance(e["logprob"], float) for e in entry.values())
    echoed = client.completions.create(**kw, echo=True, logprobs=2)
    plain = client.completions.create(**kw)
    legacy = echoed.choices[0].logprobs
    assert legacy is not None and legacy.tokens and legacy.token_logprobs
    n = len(ids)
    assert echoed.choices[0].text == prompt + plain.choices[0].text
    assert legacy.tokens[:n] == [tok.decode([i]) for i in ids]
    assert legacy.token_logprobs[:n] == [None] + [
        e[str(i)]["logprob"] for i, e in zip(ids[1:], lps[1:], strict=True)
    ]
    assert len(legacy.tokens) == n + (plain.usage.completion_tokens if plain.usage else 0)
    chat = client.chat.completions.create(
        model="", messages=RIVER, max_tokens=2, extra_body={"prompt_logprobs": 0}
    )
    chat_lps = (chat.model_extra or {})["prompt_logprobs"]
    assert chat.usage is not None and len(chat_lps) == chat.usage.prompt_tokens
    assert all(len(e) == 1 and next(iter(e.values()))["rank"] >= 1 for e in chat_lps[1:])


def test_responses_logprobs_and_messages_are_the_engines(client: openai.OpenAI) -> None:
    """On SmolLM2: the Responses text part's logprobs are the chat API's for the same
    greedy request (tokens, top-2 alternatives, values to 1e-3), and vLLM's
    `enable_response_messages` gives transformers' rendering of the prompt (text and
    ids) and the output's ids, which decode to its text."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(_make_model()))
    chat = client.chat.completions.create(
        model="", messages=RIVER, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2
    )
    assert chat.choices[0].logprobs is not None and chat.choices[0].logprobs.content
    want = [(e.token, [t.token for t in e.top_logprobs]) for e in chat.choices[0].logprobs.content]
    resp = client.responses.create(
        model="", input=RIVER, max_output_tokens=6, temperature=0,  # type: ignore[arg-type]
        include=["message.output_text.logprobs"], top_logprobs=2,
        extra_body={"enable_response_messages": True},
    )  # fmt: skip
    part = resp.output[0].content[0]  # type: ignore[union-attr]
    got = [(e.token, [t.token for t in e.top_logprobs]) for e in part.logprobs or ()]  # type: ignore[union-attr]
    assert got == want
    diffs = [
        abs(a.logprob - b.logprob)
        for a, b in zip(part.logprobs or (), chat.choices[0].logprobs.content, strict=True)  # type: ignore[union-attr]
    ]
    assert max(diffs) < 1e-3
    text = tok.apply_chat_template(RIVER, tokenize=False, add_generation_prompt=True)
    extra = resp.model_extra or {}
    assert extra["input_messages"] == [
        {
            "message": text,
            "tokens": tok.encode(text, add_special_tokens=False),
            "type": "raw_message_tokens",
        }
    ]
    [out] = extra["output_messages"]
    assert tok.decode(out["tokens"], skip_special_tokens=True) == out["message"] == resp.output_text


HOSTILE_TEMPLATE_INPUTS: dict[str, dict[str, Any]] = {
    "template variables nested 60 deep": {
        "chat_template_kwargs": {"x": json.loads("[" * 60 + "]" * 60)}
    },
    "the template's own parameter": {"chat_template_kwargs": {"messages": []}},
    "a variable the template calls": {"chat_template_kwargs": {"raise_exception": "no"}},
    "a document of 2,000,000 characters": {"documents": [{"text": "river " * 333_334}]},
    "129 documents": {"documents": [{"text": "d"}] * 129},
    "a document field not a string": {"documents": [{"text": 1}]},
    "continue a user message": {"add_generation_prompt": False, "continue_final_message": True},
    "both flags": {"continue_final_message": True},
    "token ids asked as text": {"return_token_ids": "yes"},
}


def test_hostile_template_inputs_are_4xx_fast_and_a_stream_beside_is_untouched(
    client: openai.OpenAI, vllm_worker: Proc
) -> None:
    """Each template input an attacker might send is answered below 500 within seconds,
    while a greedy stream runs beside them; that stream's answer is its answer alone,
    and the worker is the same process."""
    import concurrent.futures

    pid = vllm_worker.pid
    kw: Any = dict(model="", max_tokens=24, temperature=0)
    alone = client.chat.completions.create(messages=RIVER, **kw).choices[0].message.content
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        beside = pool.submit(
            lambda: _text(client.chat.completions.create(messages=RIVER, stream=True, **kw))
        )
        for name, body in HOSTILE_TEMPLATE_INPUTS.items():
            t0 = time.monotonic()
            try:
                client.chat.completions.create(messages=RIVER, extra_body=body, **kw)
                status = 200
            except openai.APIStatusError as err:
                status = err.status_code
            assert status < 500 and time.monotonic() - t0 < 10, (name, status)
        assert beside.result(timeout=60) == alone
    assert vllm_worker.pid == pid and vllm_worker.proc.poll() is None
