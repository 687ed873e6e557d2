"""`BatchCall` (edge/upstream/batch.py) over scripted generations: the order it reads
them in, the choices' numbering, each generation's end as a choice end, the one final,
a refusal of one prompt refusing the batch."""

from __future__ import annotations

from typing import Any

import pytest

from edge.errors import ApiError
from edge.upstream.batch import BatchCall
from generated import sluice_pb2 as pb
from tests.unit.scripted import OVERLOADED, Accept, Chunk, End, ScriptedCall, make_worker

W = make_worker("10.0.0.1:50051")


def _call(*steps: Any, rid: str) -> ScriptedCall:
    return ScriptedCall(W, steps, request_id=rid)


def _seen(msg: pb.GenerateResponse) -> tuple[Any, ...]:
    if msg.WhichOneof("kind") == "final":
        f = msg.final
        ends = [(e.reason, e.completion_tokens) for e in f.choices]
        return (msg.index, "final", f.usage.prompt_tokens, f.usage.completion_tokens, ends)
    c = msg.chunk
    if c.HasField("choice_end"):
        return (msg.index, c.choice, "end", c.choice_end.reason, c.choice_end.completion_tokens)
    return (msg.index, c.choice, c.text, list(c.prompt_token_ids))


async def _read_all(call: BatchCall) -> list[tuple[Any, ...]]:
    out = []
    while True:
        msg = await call.read()
        out.append(_seen(msg))
        if msg.WhichOneof("kind") == "final":
            return out


async def test_generations_are_read_in_turn_as_one_choice_list() -> None:
    a = _call(Accept(), Chunk("a1"), Chunk("a2"), End(prompt=3), rid="r-b0")
    b = _call(Accept(), Chunk("b1"), End(reason=pb.FINISH_REASON_LENGTH, prompt=4), rid="r-b1")
    call = BatchCall([a, b], 1, prompt_messages=False)
    assert await call.admitted()
    stop, length = pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH
    assert await _read_all(call) == [
        (0, 0, "a1", []),
        (1, 0, "a2", []),
        (2, 0, "end", stop, 2),
        (3, 1, "b1", []),
        (4, 1, "end", length, 1),
        (5, "final", 7, 3, [(stop, 2), (length, 1)]),
    ]


async def test_the_prompts_messages_come_first() -> None:
    def prompt_then(text: str, ids: list[int], rid: str) -> ScriptedCall:
        call = _call(Accept(), Chunk(text), End(prompt=len(ids)), rid=rid)
        first: pb.GenerateResponse | None = pb.GenerateResponse(request_id=rid)
        assert first is not None
        first.chunk.prompt_token_ids.extend(ids)
        original = call.read

        async def read() -> pb.GenerateResponse:  # the worker's prompt message first
            nonlocal first
            if first is not None:
                msg, first = first, None
                return msg
            return await original()

        call.read = read  # type: ignore[method-assign]
        return call

    call = BatchCall([prompt_then("x", [1, 2], "r-b0"), prompt_then("y", [3], "r-b1")], 2, True)
    assert await call.admitted()
    seen = await _read_all(call)
    assert seen[:4] == [(0, 0, "", [1, 2]), (1, 2, "", [3]), (2, 0, "x", []), (3, 0, "end", 1, 1)]
    assert seen[4][1:3] == (2, "y")


async def test_a_refused_prompt_refuses_the_batch_and_cancels_the_rest() -> None:
    a = _call(Accept(), Chunk("a1"), End(), rid="r-b0")
    b = _call(OVERLOADED, rid="r-b1")
    call = BatchCall([a, b], 1, prompt_messages=False)
    assert not await call.admitted()
    with pytest.raises(ApiError) as info:
        await call.read()
    assert info.value.status == 429
    assert a.cancels == 1
