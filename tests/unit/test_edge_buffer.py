"""The per-stream buffer: merges what the writer has not taken yet, and stays bounded."""

from __future__ import annotations

import asyncio

import pytest

from edge.buffer import StreamBuffer
from edge.errors import ApiError
from generated import sluice_pb2 as pb


async def test_take_merges_pending_deltas() -> None:
    buf = StreamBuffer()
    for i, t in enumerate(["a", "b", "c"]):
        await buf.put_chunk(t, None, i)
    batch = await buf.take(0)
    assert batch is not None
    assert (batch.text, batch.chunks, batch.cursor) == ("abc", 3, 3)
    assert buf.merged_total == 3
    assert await buf.take(0.01) is None  # nothing left: a timeout, not an empty batch


async def test_one_chunk_is_not_counted_as_merged() -> None:
    buf = StreamBuffer()
    await buf.put_chunk("x", None, 0)
    batch = await buf.take(0)
    assert batch is not None and batch.text == "x"
    assert buf.merged_total == 0


async def test_logprobs_are_concatenated() -> None:
    buf = StreamBuffer()
    await buf.put_chunk("a", [{"token": "a", "top_logprobs": []}], 0)
    await buf.put_chunk("b", [{"token": "b", "top_logprobs": []}], 1)
    batch = await buf.take(0)
    assert batch is not None and [e["token"] for e in batch.logprobs or []] == ["a", "b"]


async def test_final_comes_with_the_last_text() -> None:
    buf = StreamBuffer()
    await buf.put_chunk("end", None, 0)
    buf.finish(pb.Final(reason=pb.FINISH_REASON_STOP), 1)
    batch = await buf.take(0)
    assert batch is not None and batch.text == "end" and batch.ended and batch.cursor == 2
    assert batch.final is not None and batch.final.reason == pb.FINISH_REASON_STOP


async def test_error_after_text_keeps_the_text() -> None:
    buf = StreamBuffer()
    await buf.put_chunk("partial", None, 0)
    buf.fail(ApiError(503, "gone"))
    assert buf.error_before_data() is None  # too late for an HTTP status
    batch = await buf.take(0)
    assert batch is not None and batch.text == "partial" and batch.error is not None


async def test_error_before_data_is_reported_for_an_http_status() -> None:
    buf = StreamBuffer()
    buf.fail(ApiError(429, "busy"))
    err = buf.error_before_data()
    assert err is not None and err.status == 429


async def test_producer_waits_when_full_and_resumes_after_take() -> None:
    buf = StreamBuffer(max_bytes=10)
    await buf.put_chunk("x" * 10, None, 0)
    blocked = asyncio.create_task(buf.put_chunk("y", None, 1))
    await asyncio.sleep(0.02)
    assert not blocked.done()  # bounded: the reader of upstream is held back
    batch = await buf.take(0)
    assert batch is not None and batch.text == "x" * 10
    await asyncio.wait_for(blocked, 1)
    batch = await buf.take(0)
    assert batch is not None and batch.text == "y"


async def test_take_wakes_on_data() -> None:
    buf = StreamBuffer()
    waiter = asyncio.create_task(buf.take(5))
    await asyncio.sleep(0.01)
    await buf.put_chunk("late", None, 0)
    batch = await asyncio.wait_for(waiter, 1)
    assert batch is not None and batch.text == "late"


@pytest.mark.parametrize("admit", [True, False])
async def test_wait_admitted(admit: bool) -> None:
    buf = StreamBuffer()
    if admit:
        buf.admit()
    loop = asyncio.get_running_loop()
    t = loop.time()
    await buf.wait_admitted(0.1)
    waited = loop.time() - t
    assert buf.admitted is admit
    assert (waited < 0.05) is admit
