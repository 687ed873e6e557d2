"""The lifespan's supervisor (`edge.app.Supervisor`): a crashed background task is logged
and the others go on; shutdown cancels them last started first, one after the other."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from edge.app import Supervisor


async def until(cond: Callable[[], bool], turns: int = 1000) -> None:
    """Let the loop run until `cond` holds (bounded: fails instead of hanging)."""
    for _ in range(turns):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def test_a_crashed_task_is_logged_and_the_others_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ticks: list[int] = []

    async def crash() -> None:
        raise RuntimeError("boom")

    async def tick() -> None:
        while True:
            ticks.append(1)
            await asyncio.sleep(0)

    tasks = Supervisor()
    with caplog.at_level(logging.ERROR, logger="sluice.edge"):
        tasks.start(crash(), "crasher")
        tasks.start(tick(), "ticker")
        await until(lambda: any("crasher" in r.getMessage() for r in caplog.records))
        seen = len(ticks)
        await until(lambda: len(ticks) > seen)  # still running after the crash
        await tasks.stop()
    [record] = [r for r in caplog.records if "crasher" in r.getMessage()]
    assert record.getMessage() == "background task 'crasher' crashed"
    assert record.exc_info is not None and str(record.exc_info[1]) == "boom"


async def test_stop_cancels_last_started_first_each_before_the_next() -> None:
    log: list[str] = []
    running: set[str] = set()

    async def job(name: str) -> None:
        running.add(name)
        try:
            await asyncio.Event().wait()
        finally:
            log.append(f"{name} cancelled")
            for _ in range(10):  # a slow shutdown: the next must not start meanwhile
                await asyncio.sleep(0)
            log.append(f"{name} done")

    tasks = Supervisor()
    for name in ("metrics writer", "fleet watch", "canary watch"):
        tasks.start(job(name), name)
    await until(lambda: len(running) == 3)
    await tasks.stop()
    assert log == [
        "canary watch cancelled",
        "canary watch done",
        "fleet watch cancelled",
        "fleet watch done",
        "metrics writer cancelled",
        "metrics writer done",
    ]
