"""The tests' one wait helper: it returns what the condition gave, and fails naming it."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.waits import eventually, eventually_async


def test_returns_the_first_truthy_value() -> None:
    calls = itertools.count()
    assert eventually(lambda: next(calls) >= 3 and "ready", what="three calls") == "ready"


def test_times_out_naming_the_condition_and_the_last_value() -> None:
    queue = [1]
    with pytest.raises(AssertionError, match=r"^not within 0.05 s: the queue empties \(last"):
        eventually(lambda: not queue, what="the queue empties", timeout=0.05)
    with pytest.raises(AssertionError, match=r"last seen: 0\)\nlog tail"):
        eventually(lambda: 0, what="zero", timeout=0.02, detail=lambda: "log tail")


def test_listed_exceptions_mean_not_yet_others_propagate() -> None:
    tries = itertools.count()

    def flaky() -> bool:
        if next(tries) < 2:
            raise ConnectionError("not listening yet")
        return True

    assert eventually(flaky, what="listening", ignore=(ConnectionError,)) is True
    with pytest.raises(AssertionError, match="listening") as err:
        eventually(flaky_forever, what="listening", timeout=0.02, ignore=(ConnectionError,))
    assert isinstance(err.value.__cause__, ConnectionError)
    with pytest.raises(ValueError):
        eventually(lambda: int("x"), what="a number", ignore=(ConnectionError,))


def flaky_forever() -> bool:
    raise ConnectionError("never")


async def test_the_async_form_awaits_awaitables_and_lets_the_loop_run() -> None:
    flag = asyncio.Event()
    asyncio.get_running_loop().call_later(0.02, flag.set)
    assert await eventually_async(flag.is_set, what="the flag is set") is True

    async def answer() -> int:
        return 42

    assert await eventually_async(answer, what="an answer") == 42
    with pytest.raises(AssertionError, match="never"):
        await eventually_async(lambda: None, what="never", timeout=0.02)
