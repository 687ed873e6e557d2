"""`GenerationResponse` over a scripted call and an in-memory ASGI client: the refusal
before the first byte, the first-byte race, heartbeats, whole SSE transcripts, event
ids, failures after the 200, the client leaving, the server's cancel, resumes, whole
responses, HTTP/1.0.

The millisecond twins of test_edge_streaming, test_edge_disconnect, test_edge_faults,
test_edge_resume, test_edge_process (drain) and test_edge_pools (continuation): the
worker is a script (tests/unit/scripted.py), the client a pair of ASGI callables.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import grpc
import orjson
import pytest

from edge.api.formats import make_format
from edge.api.responses import ResponsesFormat
from edge.config import RoutingConfig, StreamConfig
from edge.obs.metrics import Metrics
from edge.stream.ids import PART_DONE, Origin, ResumeCodec, ResumePoint
from edge.stream.job import Format, Job
from edge.stream.response import GenerationResponse
from edge.upstream.calls import UpstreamCall
from edge.upstream.failover import FailoverCall
from generated import sluice_pb2 as pb
from tests.unit.scripted import (
    OVERLOADED,
    UNAVAILABLE,
    Accept,
    Chunk,
    Client,
    Do,
    End,
    Fail,
    Gate,
    Hang,
    Over,
    ScriptedCall,
    ScriptedPicker,
    Step,
    Upstream,
    make_worker,
)

CODEC = ResumeCodec(b"s" * 32)
OWNER, BODY = CODEC.tag("alice"), CODEC.tag(b"chat|the request")
CREATED = 1700000000
A, B = "10.0.0.1:50051", "10.0.0.2:50051"
W = make_worker(A)
PATH = "/v1/chat/completions"
SLOW = 60.0  # a timer that must not fire in the test


def job(
    call: UpstreamCall,
    *,
    stream: bool = True,
    fmt: Format | None = None,
    usage: bool = False,
    first_byte_s: float = SLOW,
    heartbeat_s: float = SLOW,
    **kw: Any,
) -> Job:
    return Job(
        request_id="req1",
        trace_id="trace-1",
        call=call,
        fmt=fmt or make_format("chat", "req1", "m", CREATED, usage),
        stream=stream,
        logprobs=False,
        config=StreamConfig(first_byte_s=first_byte_s, heartbeat_s=heartbeat_s),
        metrics=Metrics(),
        codec=CODEC,
        name_worker=True,
        owner=OWNER,
        body=BODY,
        **kw,
    )


def scripted(*steps: Step, rid: str = "gen-1", first_index: int = 0) -> ScriptedCall:
    return ScriptedCall(W, steps, request_id=rid, first_index=first_index)


async def serve(j: Job, client: Client | None = None) -> Client:
    client = client or Client()
    await client.run(GenerationResponse(j))
    return client


def prefix(rid: str = "gen-1", key: str = W.key) -> str:
    return CODEC.prefix(Origin(rid, key, OWNER, BODY)).decode()


def transcript(text: str, rid: str = "gen-1") -> bytes:
    """A golden SSE body: `{P}` is the stream's event id token."""
    lines = [ln.strip() for ln in text.strip().split("\n")]
    return ("\n".join(lines) + "\n\n").replace("{P}", prefix(rid)).encode()


def chunk_json(choices: str, usage: str | None = "null", obj: str = "chat.completion.chunk") -> str:
    cid = "chatcmpl-req1" if obj.startswith("chat") else "cmpl-req1"
    head = (
        f'{{"id":"{cid}","object":"{obj}","created":{CREATED},"model":"m",'
        f'"system_fingerprint":null,"choices":{choices}'
    )
    return head + ("}" if usage is None else f',"usage":{usage}}}')


def delta(content: str, usage: str | None = "null") -> str:
    return chunk_json(
        f'[{{"index":0,"delta":{{"content":"{content}"}},"logprobs":null,"finish_reason":null}}]',
        usage,
    )


HELLO: list[Step] = [Accept(), Chunk("Hello"), Chunk(" world"), End(prompt=5)]
USAGE = (
    '{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7,'
    '"prompt_tokens_details":{"cached_tokens":0}}'
)
OPENING = (
    '[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
)
FINISH = '[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]'


def ids(client: Client) -> list[tuple[str, str, int, int, int]]:
    out = []
    for e in client.data_events():
        if "id" in e:
            p = CODEC.parse(e["id"])
            out.append((p.request_id, p.worker, p.seq, p.cursor, p.part))
    return out


def finished_cleanly(client: Client, call: ScriptedCall, j: Job) -> None:
    assert client.complete and client.cancelling == 0
    assert call.settles == 1 and not call.aborted  # the RPC's OK awaited, nothing cut
    assert j.metrics.streams_in_flight == 0 and j.metrics.client_disconnects == {}


# -- whole transcripts ------------------------------------------------------------------


async def test_a_chat_stream_is_the_golden_transcript() -> None:
    call = scripted(*HELLO)
    j = job(call)
    client = await serve(j)
    assert client.status == 200
    assert client.headers == {
        "content-type": "text/event-stream; charset=utf-8",
        "cache-control": "no-cache",
        "x-accel-buffering": "no",
        "vary": "accept-encoding",
        "x-request-id": "trace-1",
        "x-sluice-worker": W.key,
    }
    open_, fin = chunk_json(OPENING, None), chunk_json(FINISH, None)
    assert client.body == transcript(f"""
        retry: 3000
        id: {{P}}0.0
        data: {open_}

        id: {{P}}1.1
        data: {delta("Hello", None)}

        id: {{P}}2.2
        data: {delta(" world", None)}

        id: {{P}}3.2~1
        data: {fin}

        id: {{P}}4.2~{PART_DONE}
        data: [DONE]
    """)
    finished_cleanly(client, call, j)
    assert j.metrics.ttft[PATH].count == 1


async def test_a_chat_stream_with_usage_is_the_golden_transcript() -> None:
    call = scripted(*HELLO)
    client = await serve(job(call, usage=True))
    usage = chunk_json("[]", USAGE)
    assert client.body == transcript(f"""
        retry: 3000
        id: {{P}}0.0
        data: {chunk_json(OPENING)}

        id: {{P}}1.1
        data: {delta("Hello")}

        id: {{P}}2.2
        data: {delta(" world")}

        id: {{P}}3.2~1
        data: {chunk_json(FINISH)}

        id: {{P}}4.2~2
        data: {usage}

        id: {{P}}5.2~{PART_DONE}
        data: [DONE]
    """)


async def test_a_completion_stream_is_the_golden_transcript() -> None:
    """No opening event: the first token's event carries `retry:`."""
    call = scripted(*HELLO)
    fmt = make_format("completion", "req1", "m", CREATED, False)
    client = await serve(job(call, fmt=fmt))

    def text(t: str, reason: str = "null") -> str:
        choices = f'[{{"index":0,"text":"{t}","logprobs":null,"finish_reason":{reason}}}]'
        return chunk_json(choices, None, obj="text_completion")

    assert client.body == transcript(f"""
        retry: 3000
        id: {{P}}0.1
        data: {text("Hello")}

        id: {{P}}1.2
        data: {text(" world")}

        id: {{P}}2.2~1
        data: {text("", '"stop"')}

        id: {{P}}3.2~{PART_DONE}
        data: [DONE]
    """)


async def test_a_generation_over_before_its_headers_still_streams() -> None:
    call = scripted(Over(), Chunk("Hi"), End())
    client = await serve(job(call))
    assert client.status == 200
    assert [e["data"] for e in client.data_events()][1:] == [
        delta("Hi", None),
        chunk_json(FINISH, None),
        "[DONE]",
    ]


async def test_event_ids_are_gapless_and_name_generation_worker_and_parts() -> None:
    call = scripted(Accept(), Chunk("a"), Chunk(""), Chunk("b"), End(), rid="0123abcd")
    client = await serve(job(call, usage=True))
    key = W.key
    # The empty chunk made no event: its index is skipped, the event counter is not.
    assert ids(client) == [
        ("0123abcd", key, 0, 0, 0),
        ("0123abcd", key, 1, 1, 0),
        ("0123abcd", key, 2, 3, 0),
        ("0123abcd", key, 3, 3, 1),
        ("0123abcd", key, 4, 3, 2),
        ("0123abcd", key, 5, 3, PART_DONE),
    ]


# -- before the first byte --------------------------------------------------------------


@pytest.mark.parametrize(
    ("refusal", "status", "error", "retry_after"),
    [
        (
            OVERLOADED,
            429,
            {"type": "rate_limit_error", "param": None, "code": "overloaded"},
            ("2", "1500"),
        ),
        (
            Fail(grpc.StatusCode.INVALID_ARGUMENT, "sampling.top_p: must be in (0, 1]"),
            400,
            {"type": "invalid_request_error", "param": "top_p", "code": "invalid_value"},
            None,
        ),
        (
            Fail(grpc.StatusCode.NOT_FOUND, "no model named x"),
            404,
            {"type": "invalid_request_error", "param": "model", "code": "model_not_found"},
            None,
        ),
        (
            UNAVAILABLE,
            503,
            {"type": "server_error", "param": None, "code": "unavailable"},
            ("1", "1000"),
        ),
    ],
    ids=["429", "400", "404", "503"],
)
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_a_refusal_before_the_first_byte_is_its_http_status(
    refusal: Fail, status: int, error: dict[str, Any], retry_after: tuple[str, str] | None,
    stream: bool,
) -> None:  # fmt: skip
    call = scripted(refusal)
    j = job(call, stream=stream)
    client = await serve(j)
    assert client.status == status
    body = orjson.loads(client.body)
    assert body == {"error": {"message": refusal.error().message, **error}}
    headers = client.headers
    assert headers["content-type"] == "application/json"
    assert headers["content-length"] == str(len(client.body))
    got = (headers.get("retry-after"), headers.get("retry-after-ms"))
    assert got == (retry_after or (None, None))
    assert client.complete and j.metrics.streams_in_flight == 0
    assert j.metrics.upstream_errors == {error["code"]: 1}


# -- the first-byte race and heartbeats -------------------------------------------------


async def test_a_slow_worker_gets_the_200_from_the_watcher_then_heartbeats() -> None:
    """The worker answers after `first_byte_s`: the watcher commits the 200 (with the
    opening event) and heartbeats while it prefills; then the events follow."""
    prefill = Gate()
    call = scripted(Hang(prefill), Accept(), Chunk("Hello"), End())
    j = job(call, first_byte_s=0.01, heartbeat_s=0.01)
    client = Client()
    task = client.run(GenerationResponse(j))
    await client.until(lambda c: c.body.count(b": keep-alive\n") >= 2)
    assert client.status == 200 and call.admissions == 1 and not call.answered.is_set()
    prefill.open()
    await task
    events = client.events()
    assert events[0]["data"] == chunk_json(OPENING, None)
    first_token = next(i for i, e in enumerate(events) if e.get("data") == delta("Hello", None))
    assert all(e == {"comment": "keep-alive"} for e in events[1:first_token])
    assert first_token >= 3
    assert [e["data"] for e in events[first_token:] if "data" in e][-1] == "[DONE]"
    assert b"keep-alive\n\n" not in client.body  # a comment is never an event's end
    assert j.metrics.heartbeats >= 2
    finished_cleanly(client, call, j)


async def test_the_body_waits_for_the_watchers_opening() -> None:
    """The race itself: the watcher is in the middle of committing (the client is not
    reading) when the worker answers. One 200, the opening, then the tokens."""
    prefill = Gate()
    call = scripted(Hang(prefill), Accept(), Chunk("Hello"), End())
    j = job(call, first_byte_s=0.01)
    client = Client()
    client.gate = Gate()
    task = client.run(GenerationResponse(j))
    await client.gate.wait_reached()  # the watcher's 200 is on its way out
    prefill.open()
    await call.answered.wait()  # the body has its answer and wants to commit too
    client.gate.open()
    await task
    assert [m["type"] for m in client.sent][:2] == ["http.response.start", "http.response.body"]
    assert client.status == 200
    assert [e["data"] for e in client.data_events()] == [
        chunk_json(OPENING, None),
        delta("Hello", None),
        chunk_json(FINISH, None),
        "[DONE]",
    ]
    assert ids(client)[0][2:] == (0, 0, 0)
    finished_cleanly(client, call, j)


async def test_a_refusal_after_the_watchers_200_is_an_error_event() -> None:
    prefill = Gate()
    call = scripted(Hang(prefill), OVERLOADED)
    j = job(call, first_byte_s=0.01)
    client = Client()
    task = client.run(GenerationResponse(j))
    await client.until(lambda c: c.status == 200 and b"data:" in c.body)
    prefill.open()
    await task
    *_, last = client.data_events()
    assert last["event"] == "error" and "id" not in last
    err = orjson.loads(last["data"])["error"]
    assert err["code"] == "overloaded" and err["retryable"] is True
    assert err["retry_after_ms"] == 1500
    assert err["last_event_id"] == client.data_events()[0]["id"]  # the opening's
    assert b"[DONE]" not in client.body and client.complete


async def test_a_heartbeat_after_idle_between_events() -> None:
    pause = Gate()
    call = scripted(Accept(), Chunk("a"), Hang(pause), Chunk("b"), End())
    j = job(call, heartbeat_s=0.01)
    client = Client()
    task = client.run(GenerationResponse(j))
    await client.until(lambda c: b": keep-alive\n" in c.body)
    pause.open()
    await task
    kinds = [e.get("data", "comment") for e in client.events()]
    a, b = kinds.index(delta("a", None)), kinds.index(delta("b", None))
    assert b > a + 1 and set(kinds[a + 1 : b]) == {"comment"}
    assert kinds[b + 1 :] == [chunk_json(FINISH, None), "[DONE]"]
    # Event ids are untouched by heartbeats: the counter runs on.
    assert [i[2] for i in ids(client)] == [0, 1, 2, 3, 4]
    finished_cleanly(client, call, j)


# -- after the 200 ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "code", "retryable"),
    [
        (UNAVAILABLE, "unavailable", True),
        (Fail(), "upstream_error", False),  # the stream broke
        (
            End(
                reason=pb.FINISH_REASON_ERROR,
                error=pb.Status(code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], message="kv"),
            ),
            "overloaded",
            True,
        ),  # an in-band failed final
    ],
    ids=["unavailable", "broken", "failed_final"],
)
async def test_a_failure_after_the_200_is_one_error_event_and_no_done(
    failure: Step, code: str, retryable: bool
) -> None:
    call = scripted(Accept(), Chunk("a"), Chunk("b"), failure)
    j = job(call)
    client = await serve(j)
    assert client.status == 200 and client.complete
    events = client.data_events()
    assert [e.get("event") for e in events] == [None, None, None, "error"]
    error = events[-1]
    assert "id" not in error
    err = orjson.loads(error["data"])["error"]
    assert err["code"] == code and err["retryable"] is retryable
    assert err["last_event_id"] == events[-2]["id"]
    assert "10.0.0.1" not in error["data"]
    assert b"[DONE]" not in client.body
    assert j.metrics.upstream_errors == {code: 1}
    assert client.cancelling == 0 and j.metrics.streams_in_flight == 0


# -- the client leaving, the server's cancel --------------------------------------------


@pytest.mark.parametrize("when", ["mid_stream", "prefill", "whole"])
async def test_the_client_leaving_cancels_the_call(when: str) -> None:
    gate = Gate()
    if when == "prefill":  # the watcher sent the 200; the worker has not answered
        call = scripted(Hang(gate), Accept(), Chunk("a"), End())
        j = job(call, first_byte_s=0.01)
    else:
        call = scripted(Accept(), Chunk("a"), Hang(gate), Chunk("b"), End())
        j = job(call, stream=when != "whole")
    client = Client()
    task = client.run(GenerationResponse(j))
    await gate.wait_reached()
    if when == "prefill":
        await client.until(lambda c: b"data:" in c.body)
    elif when == "mid_stream":
        await client.until(lambda c: delta("a", None).encode() in c.body)
    sent = len(client.sent)
    client.leave()
    await task  # ends normally: our own cancel is not the server's
    assert call.aborted and call.settles == 0
    assert len(client.sent) == sent  # nothing more is written to a client that left
    assert not client.complete
    assert client.cancelling == 0  # the request task's cancel was taken back
    assert j.metrics.client_disconnects == {PATH: 1}
    assert j.metrics.streams_in_flight == 0 and j.metrics.upstream_errors == {}


async def test_a_disconnect_after_the_last_byte_is_not_the_client_leaving() -> None:
    """uvicorn says `http.disconnect` once the response is complete too: the body, still
    waiting for the RPC's status, is not cancelled for it."""
    call = scripted(*HELLO)
    call.settling = Gate()
    j = job(call)
    client = Client()
    client.leave_when_complete = True
    task = client.run(GenerationResponse(j))
    await call.settling.wait_reached()  # the watcher has the disconnect by now
    call.settling.open()
    await task
    assert j.metrics.client_disconnects == {} and not call.aborted
    assert client.body.endswith(b"data: [DONE]\n\n") and client.cancelling == 0


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_the_servers_cancel_ends_with_a_retryable_error(stream: bool) -> None:
    """Drain past its grace: the event after the last one, or a 503 when nothing was
    sent yet (a whole response), never a cut connection."""
    gate = Gate()
    call = scripted(Accept(), Chunk("a"), Hang(gate), Chunk("b"), End())
    j = job(call, stream=stream)
    client = Client()
    task = client.run(GenerationResponse(j))
    await gate.wait_reached()
    if stream:
        await client.until(lambda c: delta("a", None).encode() in c.body)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert call.aborted and client.complete
    assert j.metrics.client_disconnects == {} and j.metrics.streams_in_flight == 0
    if not stream:
        assert client.status == 503 and client.headers["retry-after"] == "1"
        assert orjson.loads(client.body)["error"]["code"] == "unavailable"
        return
    assert client.status == 200
    events = client.data_events()
    last = events[-1]
    assert last["event"] == "error" and "id" not in last
    err = orjson.loads(last["data"])["error"]
    assert err["code"] == "unavailable" and err["retryable"] is True
    assert "shutting down" in err["message"]
    assert err["last_event_id"] == events[-2]["id"]
    assert b"[DONE]" not in client.body


@pytest.mark.parametrize("gzip", [False, True])
@pytest.mark.parametrize("body_at", ["read", "write"])
async def test_the_servers_cancel_while_the_watcher_writes_waits_for_it(
    body_at: str, gzip: bool
) -> None:
    """The watcher's heartbeat is going out (the client is not reading) when the server
    cancels the body, waiting for its next message or for that heartbeat to write its
    own event (a shielded wait: the cancel must not cancel the watcher's write). The
    drain error follows the heartbeat, whole (and a gzip body stays whole gzip)."""
    pause, wrote = Gate(), asyncio.Event()
    call = scripted(Accept(), Chunk("a"), Hang(pause), Do(wrote.set), Chunk("b"), End())
    j = job(call, heartbeat_s=0.01)
    client = Client(gzip=gzip)
    task = client.run(GenerationResponse(j))
    await client.until(lambda c: delta("a", None).encode() in c.body)
    client.gate = Gate()
    await client.gate.wait_reached()  # the watcher's heartbeat waits in `send`
    if body_at == "write":
        pause.open()
        await wrote.wait()  # the body has "b" and waits for the heartbeat to go first
    task.cancel()
    client.gate.open()
    with pytest.raises(asyncio.CancelledError):
        await task
    events = client.events()
    assert events[-2] == {"comment": "keep-alive"} and events[-1]["event"] == "error"
    err = orjson.loads(events[-1]["data"])["error"]
    assert err["code"] == "unavailable" and err["retryable"] is True
    if body_at == "read":  # (at "write": the bug of the next test)
        assert err["last_event_id"] == events[-3]["id"]
    assert client.body.endswith(b"\n\n") and client.complete and call.aborted
    assert delta("b", None).encode() not in client.body


async def drained_after_b(task: asyncio.Task[None], client: Client, gzip: bool) -> None:
    """The server cancelled while "b" waited for the client: the stream ends with the
    drain error naming the last event the client got ("b" itself only with gzip)."""
    with pytest.raises(asyncio.CancelledError):
        await task
    events = client.data_events()
    late = [None] if gzip else []  # "b"
    assert [e.get("event") for e in events] == [None, None, *late, "error"]  # opening, a
    assert (delta("b", None).encode() in client.body) is gzip and client.complete
    err = orjson.loads(events[-1]["data"])["error"]
    assert err["last_event_id"] == events[-2]["id"]


@pytest.mark.parametrize("gzip", [False, True])
async def test_a_drain_error_names_the_last_event_sent_not_one_waiting_to_be(gzip: bool) -> None:
    """Identity: the event waiting for the client is dropped. Gzip: the compressor took
    it already, so it goes out late, before the error (the body is whole gzip)."""
    pause = Gate()
    call = scripted(Accept(), Chunk("a"), Hang(pause), Chunk("b"), End())
    j = job(call)
    client = Client(gzip=gzip)
    task = client.run(GenerationResponse(j))
    await client.until(lambda c: delta("a", None).encode() in c.body)
    client.gate = Gate()  # the client stops reading (uvicorn waits to write)
    pause.open()
    await client.gate.wait_reached()  # the body's "b" waits in `send`
    task.cancel()
    client.gate.open()
    await drained_after_b(task, client, gzip)


@pytest.mark.parametrize("gzip", [False, True])
async def test_a_body_write_cancelled_in_send_is_not_lost_to_a_gzip_stream(gzip: bool) -> None:
    """The body's own write of "b" (it read "b" while the watcher's heartbeat went out)
    waits for the client when the server cancels: dropped in identity; with gzip it goes
    out before the drain error, since the compressor took it."""
    pause, wrote = Gate(), asyncio.Event()
    call = scripted(Accept(), Chunk("a"), Hang(pause), Do(wrote.set), Chunk("b"), End())
    client = Client(gzip=gzip)
    task = client.run(GenerationResponse(job(call, heartbeat_s=0.01)))
    await client.until(lambda c: delta("a", None).encode() in c.body)
    first = client.gate = Gate()
    await first.wait_reached()  # the watcher's heartbeat waits in `send`
    pause.open()
    await wrote.wait()  # the body has "b" and waits for the heartbeat to go first
    second = client.gate = Gate()
    first.open()
    await second.wait_reached()  # the body's "b" waits in `send`
    task.cancel()
    second.open()
    await drained_after_b(task, client, gzip)


# -- resumes ----------------------------------------------------------------------------

TEN: list[Step] = [Accept(), *(Chunk(f"w{i} ") for i in range(8)), End(prompt=3)]


def tail_from(steps: list[Step], cursor: int) -> list[Step]:
    """What a Resume RPC replays from `cursor`: the messages from that index on (the
    final as the generation logged it: its usage counts every token)."""
    tokens = sum(s.tokens for s in steps if isinstance(s, Chunk))
    messages = [
        replace(s, completion=tokens) if isinstance(s, End) and s.completion is None else s
        for s in steps
        if isinstance(s, Chunk | End)
    ]
    return [Accept(), *messages[cursor:]]


def resume_job(point: ResumePoint, steps: list[Step], fmt: Format, **kw: Any) -> Job:
    cursor = 0 if fmt.replay_from_start else point.cursor
    call = scripted(*tail_from(steps, cursor), rid=point.request_id, first_index=cursor)
    return job(call, fmt=fmt, resume=point, resumed="last_event_id", **kw)


def fields(client: Client) -> list[dict[str, str]]:
    return [{k: v for k, v in e.items() if k != "retry"} for e in client.data_events()]


@pytest.mark.parametrize("k", [0, 1, 4, 8, 9, 10])  # the opening .. tokens .. the ending
async def test_a_chat_stream_resumes_exactly_after_any_event(k: int) -> None:
    whole = await serve(job(scripted(*TEN), usage=True))
    events = fields(whole)
    assert len(events) == 12 and events[-1]["data"] == "[DONE]"
    point = CODEC.parse(events[k]["id"])
    fmt = make_format("chat", "req1", "m", CREATED, True)
    j = resume_job(point, TEN, fmt, usage=True)
    resumed = await serve(j)
    assert fields(resumed) == events[k + 1 :]
    assert resumed.data_events()[0]["retry"] == "3000"
    assert j.metrics.resumes == {"last_event_id": 1}
    assert j.metrics.ttft == {}  # a resume's first event is no time to first token


@pytest.mark.parametrize("k", [0, 1, 2, 3, 4, 9, -2])  # opening, first item, ..., ending
async def test_a_responses_stream_resumes_by_replaying_from_the_start(k: int) -> None:
    def fmt() -> ResponsesFormat:
        return ResponsesFormat("req1", "m", CREATED, {})

    whole = await serve(job(scripted(*TEN), fmt=fmt(), rich=True))
    events = fields(whole)
    names = [e["event"] for e in events]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] == "response.completed"
    seqs = [orjson.loads(e["data"])["sequence_number"] for e in events]
    assert seqs == list(range(len(events))) == [i[2] for i in ids(whole)]
    point = CODEC.parse(events[k]["id"])
    resumed = await serve(resume_job(point, TEN, fmt(), rich=True))
    assert fields(resumed) == events[k + 1 :] != []


async def test_a_resume_at_the_finish_replays_only_the_rest_of_the_ending() -> None:
    whole = await serve(job(scripted(*HELLO), usage=True))
    events = fields(whole)
    finish = next(e for e in events if e["data"] == chunk_json(FINISH))
    point = CODEC.parse(finish["id"])
    assert (point.cursor, point.part) == (2, 1)
    fmt = make_format("chat", "req1", "m", CREATED, True)
    resumed = await serve(resume_job(point, HELLO, fmt, usage=True))
    assert [e["data"] for e in fields(resumed)] == [chunk_json("[]", USAGE), "[DONE]"]
    assert fields(resumed) == events[-2:]


# -- whole responses, HTTP/1.0 ----------------------------------------------------------


async def test_a_whole_response_is_one_json_body() -> None:
    call = scripted(*HELLO)
    j = job(call, stream=False)
    client = await serve(j)
    assert client.status == 200
    assert client.headers["content-type"] == "application/json"
    assert client.headers["content-length"] == str(len(client.body))
    assert orjson.loads(client.body) == {
        "id": "chatcmpl-req1",
        "object": "chat.completion",
        "created": CREATED,
        "model": "m",
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello world"},
                "logprobs": None,
                "finish_reason": "stop",
                "token_ids": None,  # vLLM's return_token_ids fields, null when not asked
            }
        ],
        "usage": orjson.loads(USAGE),
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
    }
    assert [m["type"] for m in client.sent] == ["http.response.start", "http.response.body"]
    finished_cleanly(client, call, j)


async def test_a_whole_response_failing_midway_is_its_http_status() -> None:
    call = scripted(Accept(), Chunk("a"), UNAVAILABLE)
    client = await serve(job(call, stream=False))
    assert client.status == 503 and client.headers["retry-after"] == "1"
    assert orjson.loads(client.body)["error"]["code"] == "unavailable"


async def test_a_stream_over_http_1_0_is_a_505_before_anything_starts() -> None:
    call = scripted(*HELLO)
    j = job(call)
    client = await serve(j, Client(http_version="1.0"))
    assert client.status == 505
    assert orjson.loads(client.body)["error"]["code"] == "http_version_not_supported"
    assert call.admissions == 0 and call.aborted  # never started; cancelled
    assert j.metrics.streams_in_flight == 0


async def test_a_whole_response_over_http_1_0_is_served() -> None:
    client = await serve(job(scripted(*HELLO), stream=False), Client(http_version="1.0"))
    assert client.status == 200


# -- through FailoverCall: a continuation as the client sees it -------------------------

CUT: list[Step] = [Accept(), Chunk("Rivers "), Chunk("flow "), UNAVAILABLE]
REST: list[Step] = [Accept(), Chunk("to "), Chunk("the sea."), End(prompt=9)]


def routed_job(scripts: dict[str, list[list[Step]]], **sampling: Any) -> tuple[Job, Upstream]:
    opts = RoutingConfig()
    workers = [make_worker(a, "stable", opts) for a in (A, B)]
    up = Upstream(scripts)
    start = pb.StartGeneration(request_id="req", model="m")
    start.chat.messages.add(role="user", content="Rivers?")
    start.sampling.temperature = 0.8
    start.sampling.max_tokens = 10
    for name, value in sampling.items():
        setattr(start.sampling, name, value)
    call = FailoverCall(ScriptedPicker(workers, opts), workers[0], start, None, open_call=up)
    return job(call, usage=True), up


async def test_a_continued_stream_is_one_gapless_stream_naming_each_events_worker() -> None:
    """Twin of test_edge_pools' killed-mid-stream continuation: ids name the dead worker,
    then the continuing generation on the other one; usage is the whole stream's; a
    resume after the switch replays exactly what followed."""
    j, up = routed_job({A: [CUT], B: [REST]})
    client = await serve(j)
    events = fields(client)
    text = "".join(
        orjson.loads(e["data"])["choices"][0]["delta"].get("content", "") for e in events[:-2]
    )
    assert text == "Rivers flow to the sea."
    assert events[-1]["data"] == "[DONE]"
    assert orjson.loads(events[-2]["data"])["usage"]["completion_tokens"] == 4
    a, b = make_worker(A).key, make_worker(B).key
    assert ids(client) == [
        ("req", a, 0, 0, 0),
        ("req", a, 1, 1, 0),
        ("req", a, 2, 2, 0),
        ("req-c1-2", b, 3, 1, 0),
        ("req-c1-2", b, 4, 2, 0),
        ("req-c1-2", b, 5, 2, 1),
        ("req-c1-2", b, 6, 2, 2),
        ("req-c1-2", b, 7, 2, PART_DONE),
    ]
    # Resume after the switch: from the continuing generation's own messages.
    point = CODEC.parse(events[3]["id"])
    fmt = make_format("chat", "req1", "m", CREATED, True)
    assert point.worker == b and point.cursor == 1
    sent = up.calls[1].messages  # B's generation, as its replay log holds it
    # Its final's usage as ResumeCall reports it: the whole stream's (as it was sent).
    usage = sent[-1].final.usage
    steps: list[Step] = [Accept(), *(Chunk(m.chunk.text) for m in sent[1:-1])]
    steps.append(End(prompt=usage.prompt_tokens, completion=usage.completion_tokens))
    replay = ScriptedCall(make_worker(B), steps, request_id=point.request_id, first_index=1)
    resumed = await serve(job(replay, fmt=fmt, resume=point, resumed="last_event_id"))
    assert fields(resumed) == events[4:]


async def test_a_stream_that_may_not_continue_ends_with_a_retryable_error() -> None:
    j, up = routed_job({A: [CUT], B: [REST]}, seed=5)
    client = await serve(j)
    events = client.data_events()
    assert events[-1]["event"] == "error" and b"[DONE]" not in client.body
    err = orjson.loads(events[-1]["data"])["error"]
    assert err["code"] == "unavailable" and err["retryable"] is True
    assert {i[1] for i in ids(client)} == {make_worker(A).key}
    assert up.attempts == [A]
