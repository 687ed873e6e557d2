"""Anthropic's Messages API at the edge, without servers: a body as the chat path's request,
one generation's messages as its events and whole `message`, and errors in its shape."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from edge.api.message_events import MessagesFormat
from edge.api.messages import parse_messages
from edge.errors import ApiError, dialect_of
from generated import sluice_pb2 as pb


def _chunk(**fields: Any) -> pb.TokenChunk:
    calls = fields.pop("tool_calls", [])
    chunk = pb.TokenChunk(**fields)
    chunk.tool_calls.extend(pb.ToolCallDelta(**c) for c in calls)
    return chunk


def test_turns_become_the_chat_paths_messages() -> None:
    req = parse_messages(
        {
            "model": "m",
            "max_tokens": 9,
            "system": [{"type": "text", "text": "Be brief."}],
            "metadata": {"user_id": "u-1"},
            "stop_sequences": ["END"],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "t1", "name": "get", "input": {"city": "Paris"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1",
                     "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "So?"},
                ]},
            ],
            "tools": [{"name": "get", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "get", "disable_parallel_tool_use": True},
        }
    )  # fmt: skip
    got = [(m.role, m.content, m.tool_call_id, [(c.id, c.name, c.arguments)
            for c in m.tool_calls]) for m in req.messages or ()]  # fmt: skip
    assert got == [
        ("system", "Be brief.", "", []),
        ("user", "Weather?", "", []),
        ("assistant", "Let me look.", "", [("t1", "get", '{"city":"Paris"}')]),
        ("tool", "sunny", "t1", []),
        ("user", "So?", "", []),
    ]
    got_fields = (req.max_tokens, req.stop, req.user, req.parallel_tool_calls)
    assert got_fields == (9, ["END"], "u-1", False)
    assert req.tool_choice == pb.ToolChoice(function="get") and req.return_token_ids


def test_a_generation_is_anthropics_events_and_whole_message() -> None:
    chunks = [
        _chunk(prompt_token_ids=[1, 2, 3]),
        _chunk(reasoning="think"),
        _chunk(reasoning=" more", text="Hi"),
        _chunk(tool_calls=[{"index": 0, "id": "c0", "name": "f", "arguments": '{"a"'}]),
        _chunk(tool_calls=[{"index": 0, "arguments": ": 1}"}]),
    ]
    final = pb.Final(reason=pb.FINISH_REASON_TOOL_CALLS, usage=pb.Usage(
        prompt_tokens=3, completion_tokens=7, cached_prompt_tokens=1))  # fmt: skip
    fmt = MessagesFormat("r1", "m")
    events = [e for c in chunks for e in fmt.events(c, None, 0)] + fmt.ending(final, 0)
    names = [n.decode() for n, _ in events if n is not None]
    datas = [orjson.loads(d) for _, d in events]
    assert [d["type"] for d in datas] == names
    assert names == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta",  # thinking
        "content_block_delta", "content_block_stop",  # its signature, its end
        "content_block_start", "content_block_delta", "content_block_stop",  # text
        "content_block_start", "content_block_delta", "content_block_delta",  # tool_use
        "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    assert datas[0]["message"]["usage"] == {"input_tokens": 3, "output_tokens": 0}
    assert [d["index"] for d in datas if "index" in d] == [0] * 5 + [1] * 3 + [2] * 4
    assert datas[5]["delta"]["type"] == "signature_delta"
    assert datas[-2] == {"type": "message_delta",
                         "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                         "usage": {"input_tokens": 2, "cache_read_input_tokens": 1,
                                   "output_tokens": 7}}  # fmt: skip
    whole = MessagesFormat("r1", "m")
    for c in chunks:
        whole.collect(c, None)
    message = whole.whole(final, False)
    signature = datas[5]["delta"]["signature"]
    assert message["content"] == [
        {"type": "thinking", "thinking": "think more", "signature": signature},
        {"type": "text", "text": "Hi"},
        {"type": "tool_use", "id": "c0", "name": "f", "input": {"a": 1}},
    ]
    assert message["usage"] == datas[-2]["usage"] and message["stop_reason"] == "tool_use"


@pytest.mark.parametrize(
    ("final", "reason"),
    [
        (pb.Final(reason=pb.FINISH_REASON_STOP), ("end_turn", None)),
        (pb.Final(reason=pb.FINISH_REASON_STOP, stop_sequence="END"), ("stop_sequence", "END")),
        (pb.Final(reason=pb.FINISH_REASON_LENGTH), ("max_tokens", None)),
    ],
)
def test_an_empty_answer_is_one_empty_text_block_with_its_stop_reason(
    final: pb.Final, reason: tuple[str, str | None]
) -> None:
    message = MessagesFormat("r", "m").whole(final, False)
    assert message["content"] == [{"type": "text", "text": ""}]
    assert (message["stop_reason"], message["stop_sequence"]) == reason


def test_errors_answer_in_the_dialect_of_their_path() -> None:
    assert dialect_of("/v1/messages") == dialect_of("/v1/messages/count_tokens") == "anthropic"
    assert dialect_of("/v1/messagesx") == dialect_of("/v1/chat/completions") == "openai"
    err = ApiError(429, "slow down", type="rate_limit_error", param="x", code="overloaded")
    assert err.body("anthropic") == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "x: slow down"},
    }
    assert err.body()["error"] == {"message": "slow down", "type": "rate_limit_error",
                                   "param": "x", "code": "overloaded"}  # fmt: skip
    kinds = {s: ApiError(s, "m").body("anthropic")["error"]["type"]  # type: ignore[index]
             for s in (400, 401, 403, 404, 413, 502, 503, 504)}  # fmt: skip
    assert kinds == {400: "invalid_request_error", 401: "authentication_error",
                     403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                     502: "api_error", 503: "overloaded_error", 504: "timeout_error"}  # fmt: skip


async def test_middleware_errors_take_the_shape_of_the_path_they_answer() -> None:
    """What auth and limits answer with (one writer): Anthropic's body under /v1/messages,
    OpenAI's elsewhere, headers (Retry-After) alike."""
    from edge.errors import error_response

    err = ApiError(429, "Rate limit reached", type="rate_limit_error", code="rate_limit_exceeded",
                   retryable=True, retry_after_s=2.0)  # fmt: skip
    for path, body in [
        ("/v1/messages/count_tokens",
         {"type": "error", "error": {"type": "rate_limit_error", "message": "Rate limit reached"}}),
        ("/v1/chat/completions", err.body()),
    ]:  # fmt: skip
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)  # noqa: B023 (awaited within this iteration)

        async def receive() -> dict[str, Any]:
            return {"type": "http.request"}

        scope = {"type": "http", "path": path, "method": "POST", "headers": []}
        await error_response(err)(scope, receive, send)  # type: ignore[arg-type]
        assert sent[0]["status"] == 429 and (b"retry-after", b"2") in sent[0]["headers"]
        assert orjson.loads(sent[1]["body"]) == body
