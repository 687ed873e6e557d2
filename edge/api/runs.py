"""`BackgroundRuns`: the background responses this process follows (`edge.api.background`),
each a task of its own holding a run lease in the shared store, renewed every second by
one task while any runs: a replica polling one whose lease lapsed takes it over."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

from edge.store.base import Store, StoreUnavailable

LEASE_S = 3.0  # a run lease lapses this long after its holder stopped renewing it
RENEW_S = 1.0


def lease_key(key: str) -> str:
    """The run lease of the stored response `key`."""
    return f"{key}/run"


class BackgroundRuns:
    """This process's runs by document key (see the module docstring)."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._renewer: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._tasks)

    def running(self, key: str) -> bool:
        return key in self._tasks

    def start(
        self,
        key: str,
        run: Coroutine[Any, Any, Any],
        store: Store,
        release: Callable[[], None] | None = None,
    ) -> bool:
        """Run `run` in a task holding `key`'s lease, then `release` (the key's stream
        slot); False (`run` closed unstarted) if this process follows `key` already."""
        if key in self._tasks:
            run.close()
            return False
        task = self._tasks[key] = asyncio.create_task(run, name=f"background {key}")

        def ended(_: asyncio.Task[Any]) -> None:
            self._tasks.pop(key, None)
            if release is not None:
                release()

        task.add_done_callback(ended)
        if self._renewer is None:
            self._renewer = asyncio.create_task(self._renew(store), name="background leases")
        return True

    async def _renew(self, store: Store) -> None:
        try:
            while self._tasks:
                for key in list(self._tasks):
                    with contextlib.suppress(StoreUnavailable):
                        await store.put_doc(lease_key(key), "1", LEASE_S)
                await asyncio.sleep(RENEW_S)
        finally:
            self._renewer = None

    async def close(self, store: Store | None) -> None:
        """Shutdown: stop following (the generations run on for their grace) and let the
        leases go, so the next replica polling one takes it over at once."""
        tasks = list(self._tasks.items())
        for _, task in tasks:
            task.cancel()
        if self._renewer is not None:
            self._renewer.cancel()
        await asyncio.gather(*(t for _, t in tasks), return_exceptions=True)
        for key, _ in tasks:
            if store is not None:
                with contextlib.suppress(StoreUnavailable):
                    await store.delete_doc(lease_key(key))
