"""Fleet rollouts against a real redis-server, two edge processes' worth of registries
(no edge servers: their workers are marked SERVING by hand): one owner runs the plan,
the other follows through the fleet's control, and takes over when the owner stops
renewing its lease."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from edge.config import RoutingConfig
from edge.release.fleet_rollouts import FleetRollouts
from edge.release.plans import parse_plan
from edge.release.windows import LocalWindows
from edge.routing.fleet import FleetSync
from edge.routing.pools import PoolSpec
from edge.routing.registry import PoolRegistry
from edge.store.control import Control
from edge.store.rollouts import RolloutBoard
from edge.upstream.channel import ChannelFactory
from edge.upstream.worker import SERVING
from tests.redis_proc import redis_server
from tests.waits import eventually_async


@dataclass
class Process:
    registry: PoolRegistry
    rollouts: FleetRollouts
    watch: asyncio.Task[None]

    def weights(self) -> dict[str, float]:
        return {p.name: p.weight for p in self.registry.pools.values()}


@contextlib.asynccontextmanager
async def processes(url: str, prefix: str, n: int) -> AsyncIterator[list[Process]]:
    made: list[Process] = []
    closing = []
    try:
        for _ in range(n):
            specs = [PoolSpec("v1", "1", 1.0, ["s1:1"]), PoolSpec("v2", "2", 0.0, ["c1:1"])]
            reg = PoolRegistry(specs, RoutingConfig(), ChannelFactory([], None, ""))
            for w in reg.workers:
                w.status = SERVING
            control = Control(url, 1.0, prefix)
            board = RolloutBoard(url, 1.0, prefix)
            closing += [control, board]
            fleet = FleetSync(reg, control)
            rollouts = FleetRollouts(reg, board, fleet, LocalWindows(reg))
            rollouts.lease_s = 0.5
            made.append(Process(reg, rollouts, asyncio.create_task(fleet.watch())))
        yield made
    finally:
        for p in made:
            p.watch.cancel()
        await asyncio.gather(*(p.watch for p in made), return_exceptions=True)
        for c in closing:
            await c.close()


def feed(p: Process, n: int = 3) -> None:
    for _ in range(n):
        p.registry.pool_metrics("v2").outcome("ok", 0.01)
        p.registry.pool_metrics("v1").outcome("ok", 0.01)


async def test_one_owner_runs_the_plan_and_another_takes_over_when_its_lease_lapses(request):
    with redis_server() as srv:
        async with processes(srv.url, request.node.name, 2) as (a, b):
            plan = parse_plan({"canary": "v2", "steps": [25, 50, 100], "hold_s": 0.2,
                               "analysis": {"min_samples": 1}})  # fmt: skip
            t_begin = time.monotonic()
            started = await b.rollouts.begin(plan)  # through B
            rid = started["id"]
            assert started["step"] == 0
            await eventually_async(
                lambda: a.weights() == {"v1": 75, "v2": 25}, what="step 0 published to A"
            )
            await a.rollouts.check()  # A checks first: the lease is A's
            await b.rollouts.check()
            assert (a.rollouts.owner, b.rollouts.owner) == (True, False)
            feed(a)

            async def advanced_by_a() -> bool:
                await a.rollouts.check()
                return bool((await b.rollouts.one(rid))["step"] == 1)

            await eventually_async(advanced_by_a, what="A advances the plan after the hold")
            assert time.monotonic() - t_begin >= 0.2  # not before the step's hold
            await eventually_async(
                lambda: b.weights() == {"v1": 50, "v2": 50}, what="step 1 published to B"
            )
            # A stops (a dead process renews nothing); B takes over once the lease lapses.
            t_stop = time.monotonic()

            async def owned_by_b() -> bool:
                await b.rollouts.check()
                return b.rollouts.owner

            await eventually_async(owned_by_b, what="B takes the lease", timeout=2.0, interval=0.05)
            assert time.monotonic() - t_stop >= 0.4  # not before the lease's 0.5 s

            async def finished_by_b() -> bool:
                feed(b)  # samples in each step, now seen by B
                await b.rollouts.check()
                return bool((await b.rollouts.one(rid))["state"] == "finished")

            await eventually_async(finished_by_b, what="B runs the plan to its end", timeout=5.0)
            finished = {"v1": 0, "v2": 1}  # the canary takes the stable pool's old weight
            await eventually_async(
                lambda: a.weights() == b.weights() == finished, what="the end published to both"
            )
            assert a.registry.pool("v1").draining == "drained"
            done = await a.rollouts.one(rid)
            assert done == await b.rollouts.one(rid)
            events = [(e["event"], e["step"]) for e in done["history"]]
            assert events == [
                ("started", 0),
                ("advanced", 0),
                ("advanced", 1),
                ("finished", 2),
            ]
            await b.rollouts.check()  # nothing active: the lease is let go
            assert (await a.rollouts.listing())["owner"] is None
