"""`write_now`: a body chunk written in the caller's task (`edge.stream.response.take`, the
upstream reader's) when that does not wait: onto the connection (`edge.stream.wire`), else
by `send_now`, which steps an ASGI `send` by hand: uvicorn's waits only when the client
lags (flow control), and then the rest becomes a task of its own, resumed as its first
task would have."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, cast

from starlette.types import Message

from edge.stream.wire import Wire


def write_now(
    wire: Wire | None, send: Callable[[Message], Awaitable[None]], data: bytes
) -> asyncio.Future[None] | None:
    """One body chunk, more to come: None if it is written, else the future of the rest
    of its `send`."""
    if wire is not None and wire.write(data):
        return None
    return send_now(send, {"type": "http.response.body", "body": data, "more_body": True})


def send_now(
    send: Callable[[Message], Awaitable[None]], message: Message
) -> asyncio.Future[None] | None:
    """Send `message`; None if that is done, else the future of the rest of the send.
    Its exceptions are raised here if they come before the first wait."""
    coro = cast(Coroutine[Any, Any, None], send(message))  # an `async def` send
    try:
        waiting = coro.send(None)
    except StopIteration:
        return None
    rest = asyncio.ensure_future(_Rest(coro, waiting).run())
    rest.add_done_callback(lambda f: _abandon(f, coro, waiting))
    return rest


def _abandon(rest: asyncio.Future[None], coro: Coroutine[Any, Any, None], waiting: Any) -> None:
    """If the rest was cancelled, maybe before it ran: end the send where it waits, as a
    task's cancel would have (a no-op if the rest already did)."""
    if not rest.cancelled():
        return
    if isinstance(waiting, asyncio.Future):
        waiting.cancel()
    coro.close()


class _Rest:
    """A coroutine that already yielded once, awaited from where it stopped (what
    `yield from` would do had it been there from the start)."""

    __slots__ = ("_coro", "_waiting")

    def __init__(self, coro: Coroutine[Any, Any, None], waiting: Any) -> None:
        self._coro, self._waiting = coro, waiting

    async def run(self) -> None:
        await self

    def __await__(self) -> Generator[Any, Any, None]:
        coro, waiting = self._coro, self._waiting
        while True:
            try:
                value = yield waiting
            except BaseException as exc:  # thrown in (a cancel): pass it on
                try:
                    waiting = coro.throw(exc)
                except StopIteration:
                    return
                continue
            try:
                waiting = coro.send(value)
            except StopIteration:
                return
