"""Waiting on what a test means: poll a condition until it holds, or fail naming it.

`eventually(lambda: ..., what="...")` calls the predicate every `interval` seconds until
it returns something truthy (which it returns) and raises AssertionError after `timeout`
seconds, saying what never happened and the last value seen. A sleep guesses how long
an event takes; this waits for the event itself, and a slow machine only makes it wait
longer. Exceptions from the predicate propagate unless their type is in `ignore` (a
server not listening yet, say); the last ignored one is chained to the failure.
`eventually_async` is the same inside an event loop: its predicate may return an
awaitable (an RPC), and the loop runs between polls.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

INTERVAL_S = 0.01


def _failure(
    what: str, timeout: float, last: object, detail: Callable[[], object] | None
) -> AssertionError:
    text = f"not within {timeout:g} s: {what} (last seen: {last!r})"
    if detail is not None:
        text += f"\n{detail()}"
    return AssertionError(text)


def eventually(
    predicate: Callable[[], T],
    *,
    what: str,
    timeout: float = 10.0,
    interval: float = INTERVAL_S,
    ignore: tuple[type[BaseException], ...] = (),
    detail: Callable[[], object] | None = None,
) -> T:
    """Poll `predicate` until it returns a truthy value, and return that value.

    `what` names the condition for the failure message; `detail()` (a log, a state dump)
    is added to it on timeout only.
    """
    deadline = time.monotonic() + timeout
    while True:
        error: BaseException | None = None
        try:
            last: object = predicate()
        except ignore as exc:
            last = error = exc
        else:
            if last:
                return last  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise _failure(what, timeout, last, detail) from error
        time.sleep(interval)  # the poll interval, not a guess at the event


async def eventually_async(
    predicate: Callable[[], Any],
    *,
    what: str,
    timeout: float = 10.0,
    interval: float = INTERVAL_S,
    ignore: tuple[type[BaseException], ...] = (),
    detail: Callable[[], object] | None = None,
) -> Any:
    """`eventually` for coroutines: `predicate()` may be a value or an awaitable."""
    deadline = time.monotonic() + timeout
    while True:
        error: BaseException | None = None
        try:
            last: Any = predicate()
            if inspect.isawaitable(last):
                last = await last
        except ignore as exc:
            last = error = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise _failure(what, timeout, last, detail) from error
        await asyncio.sleep(interval)  # the poll interval, not a guess at the event
