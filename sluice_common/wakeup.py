"""`Wakeup`: one coroutine waits, any number of `set()` calls before it runs wake it once.

The writers of many streams (a worker's session, its multiplexed `Generate`, an edge's
session call) sleep on one of these: cheaper than an `asyncio.Event` (no clear, no
waiter list), and a `set()` with nobody waiting costs one attribute read.
"""

from __future__ import annotations

import asyncio


class Wakeup:
    __slots__ = ("_waiter",)

    def __init__(self) -> None:
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        """Wake the waiting coroutine, if one waits (a no-op otherwise)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        """Sleep until the next `set()`."""
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
