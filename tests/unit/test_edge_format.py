"""Response objects: byte templates produce the OpenAI shapes the SDK parses."""

from __future__ import annotations

import orjson
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from edge.api.formats import ChatFormat, CompletionFormat, logprob_entries, make_format
from generated import sluice_pb2 as pb

USAGE = pb.Usage(prompt_tokens=5, completion_tokens=3, cached_prompt_tokens=2)


def test_chat_chunks_parse_as_sdk_objects() -> None:
    fmt = make_format("chat", "r1", 'm"odel', 123, include_usage=False)
    assert isinstance(fmt, ChatFormat)
    opening = ChatCompletionChunk.model_validate(orjson.loads(fmt.opening()))
    assert opening.id == "chatcmpl-r1" and opening.model == 'm"odel' and opening.created == 123
    assert opening.choices[0].delta.role == "assistant"
    text = 'quote " backslash \\ newline \n unicode é 🙂'
    delta = ChatCompletionChunk.model_validate(orjson.loads(fmt.delta(text, None)))
    assert delta.choices[0].delta.content == text
    assert delta.choices[0].finish_reason is None
    finish = ChatCompletionChunk.model_validate(orjson.loads(fmt.finish("length")))
    assert finish.choices[0].finish_reason == "length"
    assert "usage" not in orjson.loads(fmt.delta("x", None))


def test_usage_null_on_every_chunk_when_asked() -> None:
    fmt = make_format("chat", "r", "m", 1, include_usage=True)
    for raw in (fmt.opening(), fmt.delta("x", None), fmt.finish("stop")):
        assert orjson.loads(raw)["usage"] is None
    last = orjson.loads(fmt.usage(USAGE))
    assert last["choices"] == []
    assert last["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    ChatCompletionChunk.model_validate(last)


def test_completion_chunks_and_response() -> None:
    fmt = make_format("completion", "r2", "m", 7, include_usage=False)
    assert isinstance(fmt, CompletionFormat)
    chunk = orjson.loads(fmt.delta("hi", None))
    # As OpenAI streams it (the SDK builds stream objects without validating: finish_reason
    # is null until the last chunk).
    assert chunk["id"] == "cmpl-r2" and chunk["object"] == "text_completion"
    assert chunk["choices"] == [{"index": 0, "text": "hi", "logprobs": None, "finish_reason": None}]
    assert orjson.loads(fmt.finish("stop"))["choices"][0]["finish_reason"] == "stop"
    whole = Completion.model_validate(fmt.response("all text", "length", USAGE, None))
    assert whole.choices[0].text == "all text" and whole.usage is not None
    assert whole.usage.total_tokens == 8


def test_chat_response() -> None:
    fmt = make_format("chat", "r3", "m", 7, include_usage=False)
    whole = ChatCompletion.model_validate(fmt.response("answer", "stop", USAGE, None))
    assert whole.choices[0].message.content == "answer"
    assert whole.choices[0].finish_reason == "stop"
    assert whole.usage is not None and whole.usage.completion_tokens == 3


def _chunk_with_logprobs() -> pb.TokenChunk:
    return pb.TokenChunk(
        text=" a b",
        token_ids=[1, 2],
        logprobs=[
            pb.TokenLogprob(
                token_id=1,
                text=" a",
                logprob=-0.5,
                top=[pb.TopLogprob(token_id=1, text=" a", logprob=-0.5)],
            ),
            pb.TokenLogprob(
                token_id=2,
                text=" b",
                logprob=-1.0,
                top=[
                    pb.TopLogprob(token_id=3, text=" c", logprob=-0.2),
                    pb.TopLogprob(token_id=2, text=" b", logprob=-1.0),
                ],
            ),
        ],
    )


def test_logprobs_chat_and_legacy_layouts() -> None:
    entries = logprob_entries(_chunk_with_logprobs())
    assert [e["token"] for e in entries] == [" a", " b"]
    assert entries[1]["top_logprobs"][0] == {
        "token": " c",
        "logprob": pytest.approx(-0.2),
        "bytes": [32, 99],
    }
    chat = make_format("chat", "r", "m", 1, include_usage=False)
    parsed = ChatCompletionChunk.model_validate(orjson.loads(chat.delta(" a b", entries)))
    assert parsed.choices[0].logprobs is not None
    content = parsed.choices[0].logprobs.content or []
    assert [c.token for c in content] == [" a", " b"]
    legacy = make_format("completion", "r", "m", 1, include_usage=False)
    first = orjson.loads(legacy.delta(" a b", entries))["choices"][0]["logprobs"]
    assert first["tokens"] == [" a", " b"] and first["text_offset"] == [0, 2]
    second = orjson.loads(legacy.delta(" a b", entries))["choices"][0]["logprobs"]
    assert second["text_offset"] == [4, 6]  # offsets continue across chunks


def test_sampled_token_text_comes_from_the_contract_not_the_alternatives() -> None:
    lp = pb.TokenLogprob(
        token_id=9,
        text=" x",
        logprob=-0.1,
        top=[pb.TopLogprob(token_id=4, text=" y", logprob=-0.05)],
    )
    chunk = pb.TokenChunk(text=" x z", token_ids=[9, 5], logprobs=[lp])
    assert logprob_entries(chunk)[0]["token"] == " x"


def test_continuous_usage_opens_with_the_prompts_count_and_skips_a_continuations() -> None:
    """The worker's prompt message (a usage, no output) gives the opening its usage; a
    continuation's own (another worker's, mid-stream) makes no event and changes nothing."""
    fmt = make_format("chat", "r", "m", 1, include_usage=True)
    fmt.continuous_usage = fmt.prompt_first = True
    assert fmt.prompts_due()
    prompt = pb.TokenChunk(usage=pb.Usage(prompt_tokens=7))
    assert fmt.events(prompt, None, 0) == [] and not fmt.prompts_due()
    opening = [orjson.loads(data) for _, data in fmt.opening_events(0)]
    got = [(c["choices"][0]["delta"]["role"], c["usage"]["prompt_tokens"]) for c in opening]
    assert got == [("assistant", 7)] and opening[0]["usage"]["completion_tokens"] == 0
    again = pb.TokenChunk(usage=pb.Usage(prompt_tokens=12))
    assert fmt.events(again, None, 1) == [] and fmt.opening_usage(0).prompt_tokens == 7  # type: ignore[union-attr]
    token = pb.TokenChunk(
        text="x", token_ids=[3], usage=pb.Usage(prompt_tokens=7, completion_tokens=1)
    )
    [(_, data)] = fmt.events(token, None, 2)
    assert orjson.loads(data)["usage"]["completion_tokens"] == 1
