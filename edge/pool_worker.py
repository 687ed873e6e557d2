"""A worker as a member of a pool: its health (grpc.health.v1 Watch, from `Worker`), the
edge's own in-flight count, passive failure marking and, optionally, the load it reports.

A worker is *routable* when its Watch says SERVING, it is not draining, it has not been
removed from its pool, and passive failure marking has not taken it out: `max_fails`
failures (unreachable, broken stream) within `fail_timeout_s` keep it out for
`fail_timeout_s`, as nginx's `max_fails`/`fail_timeout` do. A Watch that reports SERVING
again after any other status (the worker restarted) clears the passive marks.

A killed worker process closes its connection, which fails the Watch stream (the same
HTTP/2 connection as the generations) at once: the worker is out of rotation within
milliseconds. A silently dead host is found by gRPC keepalive (`--keepalive`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence

import grpc

from edge.pool_config import RoutingOptions
from edge.upstream import SERVING, Worker, _status_name
from generated import sluice_pb2 as pb

log = logging.getLogger("sluice.edge")


class PassiveHealth:
    """Failure marking from real requests (see module docstring). Pure, clock passed in."""

    def __init__(self, max_fails: int, fail_timeout_s: float) -> None:
        self.max_fails = max_fails
        self.fail_timeout_s = fail_timeout_s
        self.down_until = 0.0
        self._fails: deque[float] = deque()

    def failure(self, now: float) -> bool:
        """Count one failure; True when it takes the worker out now."""
        if self.max_fails <= 0:
            return False
        self._fails.append(now)
        while self._fails and self._fails[0] <= now - self.fail_timeout_s:
            self._fails.popleft()
        if len(self._fails) >= self.max_fails:
            self._fails.clear()
            self.down_until = now + self.fail_timeout_s
            return True
        return False

    def available(self, now: float) -> bool:
        return now >= self.down_until

    def recent(self, now: float) -> int:
        return sum(1 for t in self._fails if t > now - self.fail_timeout_s)

    def reset(self) -> None:
        self._fails.clear()
        self.down_until = 0.0


class PoolWorker(Worker):
    """A `Worker` with routing state (see module docstring)."""

    def __init__(
        self, address: str, options: Sequence[tuple[str, int]], pool: str, opts: RoutingOptions
    ) -> None:
        super().__init__(address, options)
        self.pool = pool
        self.removed = False  # out of its pool; kept open only while calls finish
        self.closed = False  # its channel is closed: no call can start on it
        self.passive = PassiveHealth(opts.max_fails, opts.fail_timeout_s)
        self.reported_load = 0  # running + waiting, from GetStats (other edges' load too)
        self.reported_draining = False
        self._stats_interval = opts.stats_interval_s
        self._poller: asyncio.Task[None] | None = None

    @property
    def serving(self) -> bool:
        return super().serving and not self.reported_draining

    def routable(self, now: float | None = None) -> bool:
        """May get a new generation now."""
        t = time.monotonic() if now is None else now
        return self.serving and not self.removed and self.passive.available(t)

    @property
    def load(self) -> int:
        return max(self.in_flight, self.reported_load)

    def version(self) -> str:
        """The version label the worker itself reports (ListModels), "" until known."""
        return self.models[0].version if self.models else ""

    def failed(self) -> None:
        """A request on this worker failed the way a dead or broken worker fails."""
        if self.passive.failure(time.monotonic()):
            log.warning(
                "worker %s out of rotation for %.1fs after %d failure(s)",
                self.address,
                self.passive.fail_timeout_s,
                self.passive.max_fails,
            )

    def _set_status(self, status: int) -> None:
        if status == SERVING and self.status != SERVING:
            self.passive.reset()  # a fresh start (or a recovered one) gets a clean slate
            self.reported_draining = False
        super()._set_status(status)

    def start(self) -> None:
        super().start()
        if self._stats_interval > 0:
            self._poller = asyncio.create_task(self._poll_stats(), name=f"stats {self.address}")

    async def close(self) -> None:
        self.closed = True
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        await super().close()

    async def _poll_stats(self) -> None:
        while True:
            await asyncio.sleep(self._stats_interval)
            if self.status != SERVING:
                continue
            try:
                stats = await self.stub.GetStats(
                    pb.GetStatsRequest(), timeout=max(self._stats_interval, 1.0)
                )
            except grpc.aio.AioRpcError:
                continue
            self.reported_load = stats.running + stats.waiting
            self.reported_draining = stats.draining

    def describe(self, now: float | None = None) -> dict[str, object]:
        """For the admin API."""
        t = time.monotonic() if now is None else now
        return {
            "id": self.key,
            "address": self.address,
            "status": _status_name(self.status),
            "routable": self.routable(t),
            "in_flight": self.in_flight,
            "reported_load": self.reported_load,
            "recent_failures": self.passive.recent(t),
            "out_for_s": round(max(0.0, self.passive.down_until - t), 3),
            "model": self.model_id(),
            "version": self.version(),
        }
