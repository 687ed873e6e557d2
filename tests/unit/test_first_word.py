"""`first_word`: an edge process's bounded wait, at startup, for each worker's first
health answer (or failure) before it accepts requests."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import pytest

from edge.upstream.worker import first_word


@dataclass
class Heard:
    """What `first_word` reads of a worker: its address and its `heard` event."""

    address: str
    heard: asyncio.Event = field(default_factory=asyncio.Event)


async def test_it_returns_once_every_worker_was_heard(caplog: pytest.LogCaptureFixture) -> None:
    a, b = Heard("10.0.0.1:50051"), Heard("10.0.0.2:50051")
    waiting = asyncio.create_task(first_word([a, b], 30.0))  # type: ignore[list-item]
    a.heard.set()
    await asyncio.sleep(0)  # one loop turn: a heard, b not yet
    assert not waiting.done()
    b.heard.set()
    await asyncio.wait_for(waiting, 5.0)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_past_its_bound_it_names_the_workers_not_heard(
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, b = Heard("10.0.0.1:50051"), Heard("10.0.0.2:50051")
    a.heard.set()
    await first_word([a, b], 0.05)  # type: ignore[list-item]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["not heard from 10.0.0.2:50051 0.05 s into startup; serving anyway"]
    assert len(asyncio.all_tasks()) == 1  # this test's own: nothing left waiting
