"""The worker's pushed load: recent rates from counters, and when a stream sends."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from model_service.intake.adapters import Adapters
from model_service.rpc.load import LoadReporter, intervals
from model_service.types import Adapter, EngineStats
from tests.waits import eventually_async


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fake_core(**stats: object) -> SimpleNamespace:
    engine = SimpleNamespace(current=EngineStats(**stats), looks=0)  # type: ignore[arg-type]

    def current() -> EngineStats:
        engine.looks += 1  # one look per round of the reporter
        return engine.current

    engine.stats = current
    return SimpleNamespace(
        engine=engine,
        ready=True,
        draining=False,
        metrics=SimpleNamespace(completion_tokens=0),
        admission=SimpleNamespace(queued=0),
        adapters=Adapters("base", 2, 16),
    )


def test_intervals_take_defaults_and_a_floor() -> None:
    assert intervals(0, 0) == (0.05, 1.0)
    assert intervals(1, 0) == (0.01, 1.0)
    assert intervals(200, 100) == (0.2, 0.2)  # the heartbeat is never shorter


def test_rates_are_over_the_recent_window() -> None:
    clock = Clock()
    core = fake_core()
    rep = LoadReporter(core, clock)  # type: ignore[arg-type]
    core.engine.current = EngineStats(extra={"prefix_cache_queries": 0, "prefix_cache_hits": 0})
    assert rep.figures().prefix_cache_hit_rate == 0.0
    for _ in range(10):  # 1 s: 100 tokens looked up, 80 found; 50 generated per second
        clock.now += 0.1
        q = core.engine.current.extra["prefix_cache_queries"] + 10
        h = core.engine.current.extra["prefix_cache_hits"] + 8
        core.engine.current = EngineStats(extra={"prefix_cache_queries": q, "prefix_cache_hits": h})
        core.metrics.completion_tokens += 5
    f = rep.figures()
    assert f.prefix_cache_hit_rate == pytest.approx(0.8)
    assert f.tokens_per_s == pytest.approx(50, rel=0.01)
    assert (f.prefix_cache_queried_tokens, f.prefix_cache_hit_tokens) == (100, 80)
    # Ten quiet seconds later: nothing looked up in the window -> the lifetime rate; no tokens.
    clock.now += 10
    rep.figures()
    clock.now += 0.3
    f = rep.figures()
    assert f.prefix_cache_hit_rate == pytest.approx(0.8) and f.tokens_per_s == 0


async def test_a_stream_sends_at_once_on_change_and_as_a_heartbeat() -> None:
    clock = Clock()
    core = fake_core(running=0, max_running=8)
    rep = LoadReporter(core, clock)  # type: ignore[arg-type]
    stream = rep.watch(0.01, 0.5)
    first = await anext(stream)
    assert (first.seq, first.running, first.max_running) == (0, 0, 8)
    core.engine.current = EngineStats(running=3, waiting=1, max_running=8)
    changed = await asyncio.wait_for(anext(stream), 1)
    assert (changed.seq, changed.running, changed.waiting) == (1, 3, 1)
    # Nothing changes: nothing is sent until the heartbeat is due.
    pending = asyncio.ensure_future(anext(stream))
    looks = core.engine.looks
    await eventually_async(lambda: core.engine.looks >= looks + 3, what="three quiet rounds")
    assert not pending.done()
    clock.now += 0.5
    beat = await asyncio.wait_for(pending, 1)
    assert (beat.seq, beat.running) == (2, 3)
    core.draining = True
    assert (await asyncio.wait_for(anext(stream), 1)).draining
    await stream.aclose()


def test_adapters_loaded_and_at_work_are_changes_a_push_carries() -> None:
    core = fake_core(running=0)
    reporter = LoadReporter(core, Clock())  # type: ignore[arg-type]
    before = reporter.figures()
    adapter = Adapter("a", "/x", 1, 8)
    core.adapters.add(adapter)
    core.adapters.acquire(adapter)
    after = reporter.figures()
    assert (after.models_version, after.active_adapters) == (1, ("a",))
    assert after.key() != before.key()  # sent at once, not at the next heartbeat
