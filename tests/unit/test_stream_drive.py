"""`send_now`: an ASGI send run to its end in the caller's task, or finished as a task of
its own from where it waited, exactly as its first task would have run it."""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Message

from edge.stream.drive import send_now


class Transport:
    """A send in uvicorn's shape: waits on `paused` (flow control) before it writes."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.paused: asyncio.Future[None] | None = None

    async def send(self, message: Message) -> None:
        if self.paused is not None:
            await self.paused
        self.written.append(message["body"])


def body(data: bytes) -> Message:
    return {"type": "http.response.body", "body": data, "more_body": True}


async def test_a_send_that_does_not_wait_is_done_before_send_now_returns() -> None:
    t = Transport()
    assert send_now(t.send, body(b"a")) is None
    assert t.written == [b"a"]


async def test_a_send_that_waits_finishes_as_a_task_once_its_wait_is_over() -> None:
    t = Transport()
    t.paused = asyncio.get_running_loop().create_future()
    rest = send_now(t.send, body(b"a"))
    assert rest is not None and t.written == []
    await asyncio.sleep(0)  # the task runs up to the same wait, and stays there
    assert not rest.done() and t.written == []
    t.paused.set_result(None)
    await rest
    assert t.written == [b"a"]


async def test_cancelling_the_rest_cancels_the_send_where_it_waits() -> None:
    t = Transport()
    t.paused = asyncio.get_running_loop().create_future()
    rest = send_now(t.send, body(b"a"))
    assert rest is not None
    rest.cancel()
    with pytest.raises(asyncio.CancelledError):
        await rest
    assert t.written == [] and t.paused.cancelled()


async def test_an_error_after_the_wait_comes_out_of_the_rest() -> None:
    t = Transport()
    t.paused = asyncio.get_running_loop().create_future()
    rest = send_now(t.send, body(b"a"))
    assert rest is not None
    t.paused.set_exception(ConnectionResetError("gone"))
    with pytest.raises(ConnectionResetError, match="gone"):
        await rest
    assert t.written == []


async def test_an_error_before_any_wait_is_raised_by_send_now() -> None:
    async def broken(message: Message) -> None:
        raise RuntimeError("closed")

    with pytest.raises(RuntimeError, match="closed"):
        send_now(broken, body(b"a"))
