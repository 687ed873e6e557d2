"""`FailoverCall` through scripted attempts: retries before the first token, continuation
after it, the limits on both, cancellation, and what each attempt counts.

The millisecond twins of test_edge_pools' failover tests and the chaos kills: an
attempt's refusal or failure is a step of its script (tests/unit/scripted.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from edge.config import RoutingConfig
from edge.errors import ApiError
from edge.upstream import failover
from edge.upstream.failover import FailoverCall, Route
from generated import sluice_pb2 as pb
from tests.unit.scripted import (
    BROKEN,
    OVERLOADED,
    UNAVAILABLE,
    Accept,
    Chunk,
    Do,
    End,
    Fail,
    Gate,
    Hang,
    Over,
    ScriptedPicker,
    Step,
    Upstream,
    make_worker,
)

A, B, C = "10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"
INVALID = Fail(grpc.StatusCode.INVALID_ARGUMENT, "sampling.top_p: must be in (0, 1]")


class Clock:
    """failover's `time`, moved by the scripts (`Do(clock.advance(s))`)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> Callable[[], None]:
        def move() -> None:
            self.now += seconds

        return move


def chat_start(**sampling: Any) -> pb.StartGeneration:
    start = pb.StartGeneration(request_id="req", model="m")
    start.chat.messages.add(role="user", content="Tell me about rivers")
    start.chat.add_generation_prompt = True
    for name, value in {"temperature": 0.8, "max_tokens": 10, "min_tokens": 5, **sampling}.items():
        if value is not None:
            setattr(start.sampling, name, value)
    return start


def setup(
    scripts: dict[str, list[list[Step]]],
    *,
    pools: dict[str, str] | None = None,
    **options: Any,
) -> tuple[ScriptedPicker, Upstream]:
    opts = RoutingConfig(**options)
    workers = [make_worker(a, (pools or {}).get(a, "stable"), opts) for a in (A, B, C)]
    return ScriptedPicker(workers, opts), Upstream(scripts)


def failover_call(
    picker: ScriptedPicker,
    upstream: Upstream,
    start: pb.StartGeneration | None = None,
    timeout_s: float | None = None,
    **kw: Any,
) -> FailoverCall:
    first = picker.workers[0]
    start = start if start is not None else chat_start()
    return FailoverCall(picker, first, start, timeout_s, "trace-1", open_call=upstream, **kw)


Seen = tuple[str, str, int, str]  # (worker, request id, index, text or "final")


async def read_all(call: FailoverCall) -> list[Seen]:
    """Read to the final; each message as (call.worker, call.request_id, index, what)."""
    seen: list[Seen] = []
    while True:
        msg = await call.read()
        what = msg.chunk.text if msg.WhichOneof("kind") == "chunk" else "final"
        seen.append((call.worker.address, call.request_id, msg.index, what))
        if what == "final":
            return seen


def worker(picker: ScriptedPicker, address: str) -> Any:
    return next(w for w in picker.workers if w.address == address)


def in_flight(picker: ScriptedPicker) -> list[int]:
    return [w.in_flight for w in picker.workers]


# -- retries before the first token -----------------------------------------------------

SERVED: list[Step] = [Accept(), Chunk("Rivers "), Chunk("flow."), End()]


@pytest.mark.parametrize(
    ("failure", "outcome", "marks"),
    [
        (UNAVAILABLE, "unavailable", True),
        (OVERLOADED, "overloaded", False),
        (BROKEN, "upstream_error", True),
        (Fail(grpc.StatusCode.INTERNAL), "upstream_error", True),  # a worker killed mid-call
        (Fail(grpc.StatusCode.UNKNOWN), "upstream_error", True),
    ],
    ids=["unavailable", "resource_exhausted", "broken", "internal", "unknown"],
)
@pytest.mark.parametrize("when", ["refused", "after_accept"])
async def test_a_failure_before_the_first_token_is_retried_on_another_worker(
    failure: Fail, outcome: str, marks: bool, when: str
) -> None:
    first: list[Step] = [failure] if when == "refused" else [Accept(), failure]
    picker, up = setup({A: [first], B: [SERVED]})
    call = failover_call(picker, up, route=Route("m", "session-1", prompt="p"))
    assert await call.admitted() is True
    assert call.worker.address == (A if when == "after_accept" else B)
    assert await read_all(call) == [
        (B, "req", 0, "Rivers "),
        (B, "req", 1, "flow."),
        (B, "req", 2, "final"),
    ]
    assert up.attempts == [A, B]
    assert up.calls[1].start is up.calls[0].start  # the same start, not a continuation
    [pick] = picker.picks
    assert (pick.model, pick.key, pick.prompt) == ("m", "session-1", "p")
    assert pick.exclude == {A} and pick.prefer_pool == "stable" and pick.chosen == B
    assert picker.outcomes() == {outcome: 1, "ok": 1}
    assert picker.releases == [A, B] and in_flight(picker) == [0, 0, 0]
    # A dead or broken worker is marked (max_fails 1 takes it out); an overloaded one not.
    assert worker(picker, A).routable() is not marks
    assert worker(picker, B).routable()
    assert call.continuations == 0 and await call.settle(1.0)


@pytest.mark.parametrize(
    ("failure", "status", "outcome"),
    [
        (INVALID, 400, "invalid_value"),
        (Fail(grpc.StatusCode.NOT_FOUND, "no model named x"), 404, "model_not_found"),
        (Fail(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline"), 504, "deadline_exceeded"),
    ],
)
async def test_a_refusal_about_the_request_is_not_retried(
    failure: Fail, status: int, outcome: str
) -> None:
    picker, up = setup({A: [[failure]]})
    call = failover_call(picker, up)
    assert await call.admitted() is False
    with pytest.raises(ApiError) as info:
        await call.read()
    assert info.value.status == status
    if failure is INVALID:
        assert info.value.param == "top_p"
    assert up.attempts == [A] and picker.picks == []
    assert picker.outcomes() == {outcome: 1} and picker.releases == [A]
    assert worker(picker, A).routable()  # the request's fault, not the worker's


async def test_a_generation_over_before_its_headers_is_read_once() -> None:
    """`admitted()` False with messages to read: the one read ahead is passed on once."""
    picker, up = setup({A: [[Over(), Chunk("Hi"), End()]]})
    call = failover_call(picker, up)
    assert await call.admitted() is True
    assert await read_all(call) == [(A, "req", 0, "Hi"), (A, "req", 1, "final")]
    assert up.calls[0].messages[-1].final.usage.completion_tokens == 1
    assert picker.outcomes() == {"ok": 1} and picker.releases == [A]


async def test_a_removed_worker_is_skipped_without_an_attempt() -> None:
    picker, up = setup({B: [SERVED]})
    worker(picker, A).closed = True  # removed (admin API) after it was picked
    call = failover_call(picker, up)
    assert await call.admitted() is True
    assert [s[0] for s in await read_all(call)] == [B, B, B]
    assert up.attempts == [B] and picker.picks[0].exclude == {A}
    assert picker.outcomes() == {"ok": 1} and picker.releases == [B]


@pytest.mark.parametrize(("max_tries", "attempts"), [(1, [A]), (2, [A, B]), (3, [A, B, C])])
async def test_never_the_same_worker_twice_and_at_most_max_tries(
    max_tries: int, attempts: list[str]
) -> None:
    # Passive marking off: only the exclusion keeps a failed worker from a second try.
    scripts: dict[str, list[list[Step]]] = {a: [[UNAVAILABLE]] for a in (A, B, C)}
    picker, up = setup(scripts, max_tries=max_tries, max_fails=0)
    call = failover_call(picker, up)
    assert await call.admitted() is False
    with pytest.raises(ApiError) as info:
        await call.read()
    assert info.value.status == 503 and info.value.retryable
    assert up.attempts == attempts
    assert [p.exclude for p in picker.picks] == [set(attempts[:i]) for i in range(1, max_tries)]
    assert picker.outcomes() == {"unavailable": max_tries}
    assert picker.releases == attempts and in_flight(picker) == [0, 0, 0]


async def test_out_of_workers_the_last_refusal_is_reported() -> None:
    last = Fail(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", retry_after_ms=2500)
    picker, up = setup({A: [[UNAVAILABLE]], B: [[UNAVAILABLE]], C: [[last]]}, max_tries=5)
    call = failover_call(picker, up)
    assert await call.admitted() is False
    with pytest.raises(ApiError) as info:
        await call.read()
    assert info.value.status == 429 and info.value.retry_after_s == 2.5
    assert up.attempts == [A, B, C]
    assert picker.picks[-1].exclude == {A, B, C} and picker.picks[-1].chosen == ""


@pytest.mark.parametrize(("elapsed", "served"), [(4.0, True), (6.0, False)])
async def test_the_retry_budget_counts_from_the_first_failure(
    monkeypatch: pytest.MonkeyPatch, elapsed: float, served: bool
) -> None:
    clock = Clock()
    monkeypatch.setattr(failover, "time", clock)
    slow_refusal: list[Step] = [Do(clock.advance(elapsed)), UNAVAILABLE]
    picker, up = setup({A: [[UNAVAILABLE]], B: [slow_refusal], C: [SERVED]}, retry_budget_s=5)
    call = failover_call(picker, up)
    assert await call.admitted() is served
    assert up.attempts == ([A, B, C] if served else [A, B])
    if not served:
        with pytest.raises(ApiError) as info:
            await call.read()
        assert info.value.code == "unavailable"


async def test_the_deadline_bounds_every_attempt_and_the_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr(failover, "time", clock)
    scripts: dict[str, list[list[Step]]] = {
        A: [[Do(clock.advance(3)), UNAVAILABLE]],
        B: [[Do(clock.advance(8)), UNAVAILABLE]],  # the 10 s are over now
        C: [SERVED],
    }
    picker, up = setup(scripts, retry_budget_s=100)
    call = failover_call(picker, up, timeout_s=10)
    assert await call.admitted() is False
    assert up.attempts == [A, B]
    assert [c.timeout_s for c in up.calls] == [10, 7]  # what is left of the deadline


# -- continuation after tokens ----------------------------------------------------------

CUT: list[Step] = [Accept(), Chunk("Rivers "), Chunk("flow ", 2), UNAVAILABLE]
REST: list[Step] = [Accept(), Chunk("to "), Chunk("the sea."), End(prompt=13)]


async def test_a_stream_broken_after_tokens_is_continued_elsewhere() -> None:
    picker, up = setup({A: [CUT], B: [REST]}, pools={B: "canary", C: "canary"})
    call = failover_call(picker, up)
    assert await call.admitted() is True
    # Each message keeps its own generation's index; worker and request id name it.
    assert await read_all(call) == [
        (A, "req", 0, "Rivers "),
        (A, "req", 1, "flow "),
        (B, "req-c1-3", 0, "to "),
        (B, "req-c1-3", 1, "the sea."),
        (B, "req-c1-3", 2, "final"),
    ]
    start = up.calls[1].start
    assert start is not None and start.request_id == "req-c1-3"
    assert [(m.role, m.content) for m in start.chat.messages] == [
        ("user", "Tell me about rivers"),
        ("assistant", "Rivers flow "),
    ]
    assert start.chat.add_generation_prompt is False
    assert (start.sampling.max_tokens, start.sampling.min_tokens) == (7, 2)
    assert start.sampling.temperature == pytest.approx(0.8)
    # The usage is the whole stream's: 3 + 2 completion tokens; the continuation's
    # prompt held the 3 already sent.
    final = up.calls[1].messages[-1].final
    assert (final.usage.completion_tokens, final.usage.prompt_tokens) == (5, 10)
    assert call.continuations == 1
    assert picker.metrics["canary"].continuations == 1
    assert picker.metrics["stable"].continuations == 0
    assert picker.outcomes("stable") == {"unavailable": 1}
    assert picker.outcomes("canary") == {"ok": 1}
    assert picker.releases == [A, B] and in_flight(picker) == [0, 0, 0]
    assert not worker(picker, A).routable()  # passive marking: the dead worker is out
    assert picker.picks[0].exclude == {A} and picker.picks[0].prefer_pool == "stable"


async def test_a_raw_prompt_is_continued_with_the_text_appended() -> None:
    start = chat_start(max_tokens=None, min_tokens=None)
    start.ClearField("chat")
    start.prompt = "Once upon"
    picker, up = setup({A: [[Accept(), Chunk(" a"), BROKEN]], B: [REST]})
    call = failover_call(picker, up, start)
    assert await call.admitted()
    await read_all(call)
    cont = up.calls[1].start
    assert cont is not None and cont.prompt == "Once upon a"
    assert not cont.sampling.HasField("max_tokens") and cont.sampling.min_tokens == 0
    assert up.calls[1].messages[-1].final.usage.completion_tokens == 3


async def test_a_second_continuation_goes_on_from_all_text_sent() -> None:
    second: list[Step] = [Accept(), Chunk("to "), BROKEN]
    picker, up = setup({A: [CUT], B: [second], C: [[Accept(), Chunk("sea."), End(prompt=20)]]})
    call = failover_call(picker, up)
    assert await call.admitted()
    seen = await read_all(call)
    assert [(w, rid, i) for w, rid, i, _ in seen] == [
        (A, "req", 0),
        (A, "req", 1),
        (B, "req-c1-3", 0),
        (C, "req-c2-4", 0),
        (C, "req-c2-4", 1),
    ]
    start = up.calls[2].start
    assert start is not None and start.chat.messages[-1].content == "Rivers flow to "
    assert len(start.chat.messages) == 2  # one assistant message: the original's + text
    assert (start.sampling.max_tokens, start.sampling.min_tokens) == (6, 1)
    final = up.calls[2].messages[-1].final
    assert (final.usage.completion_tokens, final.usage.prompt_tokens) == (5, 16)
    assert call.continuations == 2
    assert picker.picks[1].exclude == {A, B}


async def test_a_refused_continuation_is_retried_with_the_same_start() -> None:
    picker, up = setup({A: [CUT], B: [[OVERLOADED]], C: [REST]})
    call = failover_call(picker, up)
    assert await call.admitted()
    assert [s[:2] for s in await read_all(call)][2:] == [(C, "req-c1-3")] * 3
    assert [c.start.request_id for c in up.calls if c.start] == ["req", "req-c1-3", "req-c1-3"]
    assert call.continuations == 1
    assert picker.outcomes() == {"unavailable": 1, "overloaded": 1, "ok": 1}


async def test_a_continuation_nobody_takes_reports_the_original_failure() -> None:
    picker, up = setup({A: [CUT], B: [[INVALID]]})
    call = failover_call(picker, up)
    assert await call.admitted()
    await call.read()
    await call.read()
    with pytest.raises(ApiError) as info:
        await call.read()
    assert info.value.code == "unavailable" and info.value.retryable  # not B's 400
    assert up.attempts == [A, B] and call.continuations == 0


SAMPLED: dict[str, Any] = {}
GREEDY, SEEDED = {"temperature": 0.0}, {"seed": 7}
UNSET = {"temperature": None}  # no temperature: the worker's default (sampled)


@pytest.mark.parametrize(
    ("mode", "sampling", "continued"),
    [
        ("sampled", SAMPLED, True),
        ("sampled", UNSET, True),
        ("sampled", GREEDY, False),
        ("sampled", SEEDED, False),
        ("always", GREEDY, True),
        ("always", SEEDED, True),
        ("never", SAMPLED, False),
    ],
)
async def test_continue_on_failure_modes(
    mode: str, sampling: dict[str, Any], continued: bool
) -> None:
    picker, up = setup({A: [CUT], B: [REST]}, continue_on_failure=mode)
    call = failover_call(picker, up, chat_start(**sampling))
    assert await call.admitted()
    if continued:
        assert [s[3] for s in await read_all(call)][-1] == "final"
        assert up.attempts == [A, B]
        return
    assert [(await call.read()).chunk.text for _ in range(2)] == ["Rivers ", "flow "]
    with pytest.raises(ApiError) as info:
        await call.read()
    assert info.value.code == "unavailable" and info.value.retryable
    assert up.attempts == [A] and picker.picks == []
    assert picker.outcomes() == {"unavailable": 1} and picker.releases == [A]


def _structured(start: pb.StartGeneration) -> None:
    start.structured_output.json_schema = '{"type": "array"}'


def _tools(start: pb.StartGeneration) -> None:
    start.chat.tools.add(name="lookup", parameters_json="{}")


def _choices(start: pb.StartGeneration) -> None:
    start.sampling.n = 2


@pytest.mark.parametrize("constrain", [_structured, _tools, _choices])
async def test_a_constrained_request_is_never_continued(constrain: Any) -> None:
    start = chat_start()
    constrain(start)
    picker, up = setup({A: [CUT], B: [REST]}, continue_on_failure="always")
    call = failover_call(picker, up, start)
    assert await call.admitted()
    await call.read()
    await call.read()
    with pytest.raises(ApiError) as info:
        await call.read()
    assert info.value.code == "unavailable" and up.attempts == [A]


async def test_a_call_built_not_continuable_is_not_continued() -> None:
    picker, up = setup({A: [CUT], B: [REST]}, continue_on_failure="always")
    call = failover_call(picker, up, continuable=False)
    assert await call.admitted()
    await call.read()
    await call.read()
    with pytest.raises(ApiError):
        await call.read()
    assert up.attempts == [A]


@pytest.mark.parametrize(
    ("failure", "continued"),
    [
        (UNAVAILABLE, True),
        (BROKEN, True),
        (Fail(grpc.StatusCode.INTERNAL), True),
        (OVERLOADED, False),
        (Fail(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline"), False),
    ],
    ids=["unavailable", "broken", "internal", "resource_exhausted", "deadline"],
)
async def test_which_failures_after_tokens_continue(failure: Fail, continued: bool) -> None:
    picker, up = setup({A: [[Accept(), Chunk("Rivers "), failure]], B: [REST]})
    call = failover_call(picker, up)
    assert await call.admitted()
    await call.read()
    if continued:
        assert (await call.read()).chunk.text == "to "
        assert call.request_id == "req-c1-1"
    else:
        with pytest.raises(ApiError) as info:
            await call.read()
        assert info.value.code == failure.error().code
    assert up.attempts == ([A, B] if continued else [A])


async def test_every_token_sent_and_only_the_final_lost_ends_as_length() -> None:
    """max_tokens were all forwarded when the stream broke: no continuation of 0 tokens,
    the `final` is made here, indexed as the broken attempt's next message."""
    picker, up = setup({A: [CUT], B: [REST]})
    call = failover_call(picker, up, chat_start(max_tokens=3))
    assert await call.admitted()
    await call.read()
    await call.read()
    msg = await call.read()
    assert msg.WhichOneof("kind") == "final"
    assert (msg.request_id, msg.index, call.worker.address) == ("req", 2, A)
    assert msg.final.reason == pb.FINISH_REASON_LENGTH
    assert msg.final.usage.completion_tokens == 3
    assert up.attempts == [A] and call.continuations == 0
    assert picker.outcomes() == {"unavailable": 1} and picker.releases == [A]


# -- cancellation and what an attempt counts --------------------------------------------


async def test_cancel_during_an_attempt_ends_it_once_and_tries_no_other() -> None:
    gate = Gate()
    picker, up = setup({A: [[Accept(), Chunk("Rivers "), Hang(gate), Chunk("x"), End()]]})
    call = failover_call(picker, up)
    assert await call.admitted()
    await call.read()
    reading = asyncio.ensure_future(call.read())
    await gate.wait_reached()
    call.cancel()
    with pytest.raises(ApiError) as info:
        await reading
    assert info.value.code == "cancelled"
    assert up.calls[0].aborted and up.attempts == [A] and picker.picks == []
    assert picker.outcomes() == {"cancelled": 1} and picker.releases == [A]
    assert in_flight(picker) == [0, 0, 0]
    assert worker(picker, A).routable()  # the client left: not the worker's failure
    call.cancel()  # again: nothing more is counted
    assert picker.outcomes() == {"cancelled": 1} and picker.releases == [A]


async def test_cancel_while_waiting_for_admission() -> None:
    gate = Gate()
    picker, up = setup({A: [[Hang(gate), Accept(), End()]], B: [SERVED]})
    call = failover_call(picker, up)
    admitting = asyncio.ensure_future(call.admitted())
    await gate.wait_reached()
    call.cancel()
    assert await admitting is False
    with pytest.raises(ApiError) as info:
        await call.read()
    assert info.value.code == "cancelled"
    assert up.attempts == [A] and picker.picks == []
    assert picker.outcomes() == {"cancelled": 1} and picker.releases == [A]


async def test_a_call_cancelled_before_it_started_opens_nothing() -> None:
    picker, up = setup({A: [SERVED]})
    call = failover_call(picker, up)
    call.cancel()
    with pytest.raises(ApiError) as info:
        await call.admitted()
    assert info.value.code == "cancelled"
    assert up.calls == [] and picker.outcomes() == {} and in_flight(picker) == [0, 0, 0]


async def test_cancel_after_the_final_counts_nothing_more() -> None:
    picker, up = setup({A: [SERVED]})
    call = failover_call(picker, up)
    assert await call.admitted()
    await read_all(call)
    call.cancel()  # the response's `finally` always does
    assert picker.outcomes() == {"ok": 1} and picker.releases == [A]
    assert not up.calls[0].aborted


async def test_an_attempt_holds_one_slot_and_times_its_tokens() -> None:
    gate = Gate()
    picker, up = setup({A: [[Accept(), Chunk("a"), Chunk("b", 3), Hang(gate), Chunk("c"), End()]]})
    call = failover_call(picker, up)
    assert await call.admitted()
    assert in_flight(picker) == [1, 0, 0]
    reading = asyncio.ensure_future(read_all(call))
    await gate.wait_reached()
    assert in_flight(picker) == [1, 0, 0] and picker.releases == []
    gate.open()
    await reading
    metrics = picker.metrics["stable"]
    assert metrics.outcomes == {"ok": 1} and in_flight(picker) == [0, 0, 0]
    assert metrics.ttft.count == 1  # once per attempt, at its first token
    assert metrics.itl.count == 4  # one mean gap, weighted by its 4 gaps (5 tokens)
    assert metrics.window(60).requests == 1
