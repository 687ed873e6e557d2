"""The fleet's rollouts (`--store-url`): one document in Redis, a copy in every process
(refreshed on each check), run by the process holding the lease (`LEASE_S`); a change is
saved as a compare-and-set, then its weights published through the fleet's control. A
lost save gives way (`FleetSync.resync`); while Redis fails the rollout holds its step."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from typing import Any

import orjson

from edge.errors import ApiError
from edge.release.plans import Plan
from edge.release.rollouts import CHECK_INTERVAL_S, Rollout, Rollouts, act
from edge.release.windows import Windows
from edge.routing.fleet import FleetSync
from edge.routing.registry import PoolRegistry
from edge.store.base import StoreUnavailable
from edge.store.rollouts import RolloutBoard

log = logging.getLogger("sluice.edge")
LEASE_S = 2.0  # the owner's lease; it renews it on every check
TRIES = 5  # compare-and-set attempts of an operator's change


class FleetRollouts:
    """The admin API's rollouts (the interface of `Rollouts`), for the whole fleet."""

    def __init__(
        self, registry: PoolRegistry, board: RolloutBoard, fleet: FleetSync, windows: Windows
    ) -> None:
        self.registry = registry
        self.board = board
        self.fleet = fleet
        self.local = Rollouts(registry, windows)
        self.me = f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"
        self.version = 0  # of the document `local` mirrors
        self.owner = False
        self.up = True
        self.lease_s = LEASE_S
        self.unpublished = False  # weights saved in the document, not yet published

    # -- the copy ---------------------------------------------------------------------

    def _mirror(self, version: int, body: bytes) -> None:
        states = orjson.loads(body)["rollouts"] if body else []
        kept = self.local.kept
        kept.clear()
        for state in states:
            kept[state["id"]] = Rollout.from_state(
                state, self.registry, self.local.transitions, self.local.windows
            )
        self.version = version

    def _document(self) -> tuple[bytes, str]:
        states = [r.to_state() for r in self.local.kept.values()]
        active = self.local.active()
        return orjson.dumps({"rollouts": states}), active.id if active else ""

    async def _refresh(self) -> bool:
        """The latest document; whether this process holds the lease."""
        owner, version, body = await self.board.tick(self.me, self.lease_s, self.version)
        if body is not None:
            self._mirror(version, body)
        return owner

    async def _publish(self) -> None:
        """The pools' weights to the fleet; if Redis fails now, again at the next check."""
        self.unpublished = True
        await self.fleet.publish()
        self.unpublished = False

    async def _save(self, me: str = "") -> bool:
        body, active = self._document()
        # Until saved, the copy changed here is not the fleet's: if the save loses (or
        # fails), the next refresh replaces it whatever the version.
        expect, self.version = self.version, -1
        version = await self.board.save(body, active, expect, me)
        self.version = version or -1
        return bool(version)

    # -- the owner ----------------------------------------------------------------------

    async def check(self) -> None:
        """One check: refresh the copy; the owner ticks the active rollout."""
        if self.unpublished:
            await self._publish()
        owner = await self._refresh()
        took_over, self.owner = owner and not self.owner, owner
        active = self.local.active()
        if not owner or active is None:
            return
        now = time.monotonic()
        if took_over:
            log.info("rollout %s: run by this process (%s) now", active.id, self.me)
            active.apply_step(now)
        before = (active.state, active.step, len(active.history))
        active.tick(now)
        if not took_over and (active.state, active.step, len(active.history)) == before:
            return
        if await self._save(self.me):
            await self._publish()
        else:  # an operator (or a new owner) came first: theirs stands
            await self.fleet.resync()

    async def watch(self) -> None:
        """`check` every CHECK_INTERVAL_S, until cancelled (a task of the registry)."""
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            try:
                await self.check()
            except StoreUnavailable as exc:
                if self.up:
                    log.warning("fleet rollouts: %s; holding until Redis is back", exc)
                self.up = self.owner = False
                continue
            except Exception:  # a bug here must not stop routing
                log.exception("rollout check failed")
                continue
            if not self.up:
                log.info("fleet rollouts: Redis answers again")
                self.up = True

    # -- the admin API --------------------------------------------------------------------

    async def begin(self, plan: Plan) -> dict[str, Any]:
        await self._refresh()
        seq = await self.board.next_seq()
        rollout = self.local.start(plan, rid=f"{time.strftime('%Y%m%d-%H%M%S')}-{seq}")
        if not await self._save():
            await self.fleet.resync()
            raise ApiError(409, "the rollouts changed meanwhile: try again", code="conflict")
        await self._published_or_later()
        return rollout.describe()

    async def listing(self) -> dict[str, Any]:
        await self._refresh()
        return {**self.local.describe(), "owner": await self.board.owner()}

    async def one(self, rid: str) -> dict[str, Any]:
        await self._refresh()
        return self.local.get(rid).describe()

    async def act(self, rid: str, action: str) -> dict[str, Any]:
        for _ in range(TRIES):
            await self._refresh()
            rollout = self.local.get(rid)
            act(rollout, action, time.monotonic())
            if await self._save():
                await self._published_or_later()
                return rollout.describe()
            await self.fleet.resync()  # the owner saved first: act on its document
        raise ApiError(409, f"rollout {rid} keeps changing: try again", code="conflict")

    async def _published_or_later(self) -> None:
        """After an operator's change was saved: its weights published now, or by this
        process's next checks if Redis fails in between (the change itself stands)."""
        try:
            await self._publish()
        except StoreUnavailable as exc:
            log.warning("rollout weights not published yet (%s): retrying", exc)

    def span(self) -> float:
        return self.local.span()

    def render_metrics(self) -> str:
        return self.local.render_metrics()
