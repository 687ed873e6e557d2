"""Stopping a task that calls Redis (`edge.store.connection.cancel_and_wait`): Python
3.11's `asyncio.wait_for` loses a cancellation that arrives in the same turn as its
result (redis-py sends every command through it), so one `cancel()` may not end a lease
renewer: the helper asks again, within a bound (a test once hung 300 s on this)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from edge.store.connection import cancel_and_wait


async def renewer_like(futures: asyncio.Queue[asyncio.Future[int]], answered: list[int]) -> None:
    """A loop of calls, each awaited through `wait_for` as redis-py awaits a send."""
    loop = asyncio.get_running_loop()
    while True:
        fut: asyncio.Future[int] = loop.create_future()
        await futures.put(fut)
        answered.append(await asyncio.wait_for(fut, 10))


async def cancelled_with_its_answer() -> tuple[asyncio.Task[None], list[int]]:
    """A renewer-like task cancelled in the same turn as its call's answer arrives."""
    futures: asyncio.Queue[asyncio.Future[int]] = asyncio.Queue()
    answered: list[int] = []
    task = asyncio.create_task(renewer_like(futures, answered))
    fut = await futures.get()
    await asyncio.sleep(0)  # the task waits inside wait_for now
    fut.set_result(1)
    task.cancel()
    return task, answered


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="wait_for keeps the cancel from 3.12")
async def test_wait_for_loses_a_cancel_that_arrives_with_its_result() -> None:
    task, answered = await cancelled_with_its_answer()
    done, _ = await asyncio.wait({task}, timeout=0.1)
    assert (done, answered, task.cancelling()) == (set(), [1], 1)  # it runs on
    task.cancel()
    await asyncio.wait({task}, timeout=1)
    assert task.cancelled()


async def test_cancel_and_wait_ends_a_task_whose_first_cancel_was_lost() -> None:
    task, answered = await cancelled_with_its_answer()
    assert await cancel_and_wait(task, 0.05) is True
    assert task.cancelled() and answered == [1]


async def test_cancel_and_wait_gives_up_within_its_bound_on_a_task_that_never_ends() -> None:
    stop = asyncio.Event()

    async def stubborn() -> None:
        while not stop.is_set():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                pass

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await cancel_and_wait(task, 0.05, tries=3) is False
    assert 0.15 <= loop.time() - t0 < 1.0
    stop.set()
    task.cancel()
    await asyncio.wait({task}, timeout=1)
    assert task.done()


async def test_cancel_and_wait_retrieves_a_failure_and_says_it_ended() -> None:
    async def fails_on_cancel() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    task = asyncio.create_task(fails_on_cancel())
    await asyncio.sleep(0)
    assert await cancel_and_wait(task, 1.0) is True
    assert isinstance(task.exception(), RuntimeError)
