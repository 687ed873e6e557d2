"""Browser streams' detached generations (`POST /v1/streams`): each holds its key's stream
slot until a reader of its link gets the final message, or the grace ends with nobody
reading (the worker aborts it then). The hold is this process's; the slot is the store's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class _Held:
    release: Callable[[], None]
    timer: asyncio.TimerHandle | None = None
    readers: int = 0


class DetachedStreams:
    """Slots of detached generations, by request id."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._held: dict[str, _Held] = {}

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, request_id: str, release: Callable[[], None]) -> None:
        """A generation started detached: its slot is held until `release`d here."""
        held = self._held[request_id] = _Held(release)
        self._arm(request_id, held)

    def reading(self, request_id: str) -> Callable[[bool], None] | None:
        """A reader opened the stream; call what this returns with True when it got the
        final message, False when it left before. None if nothing is held for it."""
        held = self._held.get(request_id)
        if held is None:
            return None
        held.readers += 1
        if held.timer is not None:
            held.timer.cancel()
            held.timer = None

        def done(finished: bool) -> None:
            held.readers -= 1
            if finished:
                self._end(request_id)
            elif held.readers == 0 and request_id in self._held:
                self._arm(request_id, held)

        return done

    def _arm(self, request_id: str, held: _Held) -> None:
        loop = asyncio.get_running_loop()
        held.timer = loop.call_later(self.grace_s, self._end, request_id)

    def _end(self, request_id: str) -> None:
        held = self._held.pop(request_id, None)
        if held is not None:
            if held.timer is not None:
                held.timer.cancel()
            held.release()
