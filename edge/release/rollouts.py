"""Rollout plans, run (`Rollouts`; `Rollout.tick` every `CHECK_INTERVAL_S`): the canary's
weight raised step by step while it holds up against the stable pool, rolled back at once
when it does not; every transition logged, kept in its history and counted. State lives
in this process; `edge.release.fleet_rollouts` runs it for a fleet."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import OrderedDict
from typing import Any

from edge.errors import ApiError
from edge.obs.outcomes import WindowStats
from edge.obs.prom import Exposition, labels
from edge.release.plans import Plan, judge, parse_plan
from edge.release.windows import LocalWindows, Windows
from edge.routing.pools import PoolConfigError
from edge.routing.registry import PoolRegistry

log = logging.getLogger("sluice.edge")
CHECK_INTERVAL_S = 0.1
KEEP = 20  # rollouts remembered (the oldest ended ones are forgotten first)
UNROUTABLE_GRACE_S = 1.0  # a canary with no routable worker this long (or a window) fails
ACTIVE = ("running", "paused")
STATES = ("running", "paused", "finished", "rolled_back", "aborted")


class Rollout:
    """One plan being run (see the module docstring); `tick` moves it on."""

    def __init__(
        self,
        rid: str,
        plan: Plan,
        registry: PoolRegistry,
        counts: dict[str, int],
        now: float,
        windows: Windows | None = None,
    ) -> None:
        self.id = rid
        self.plan = plan
        self.registry = registry
        self.windows: Windows = windows or LocalWindows(registry)
        self.state = "running"
        self.reason = ""
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.created_at = time.time()
        self._counts = counts
        stable = registry.pool(plan.stable)
        self._stable_weight = stable.weight if stable.weight > 0 else 100.0
        self._step_started = now
        self._baseline: WindowStats | None = None
        self._down_since: float | None = None
        registry.pool(plan.canary).draining = ""  # started on purpose: back in service
        self.apply_step(now)
        self._event("started", now)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    # -- moving on ----------------------------------------------------------------------

    def tick(self, now: float) -> None:
        if not self.active:
            return
        plan, reg = self.plan, self.registry
        missing = [p for p in (plan.canary, plan.stable) if p not in reg.pools]
        if missing:
            self._end("aborted", f"pool {missing[0]} was removed", now)
            return
        a = plan.analysis
        hold = plan.hold_s[self.step]
        window = a.window_s or hold or 1.0
        since = self._step_started
        windows = self.windows
        baseline = self._stable_baseline(window, now)
        reason = judge(a, windows.window(plan.canary, min(window, now - since), now), baseline)
        reason = reason or self._unroutable(window, now)
        if reason is None and self.state == "running" and now >= since + hold:
            whole = windows.window(plan.canary, now - since, now)
            if whole.requests < a.min_samples:
                return  # held, but too little seen to judge yet
            reason = judge(a, whole, baseline)
            if reason is None:
                enough = windows.nth_since(plan.canary, since, a.min_samples) or now
                self._advance(now, max(since + hold, enough))
                return
        if reason is not None:
            self._end("rolled_back", reason, now)

    def _advance(self, now: float, due: float) -> None:
        if self.step + 1 < len(self.plan.steps):
            self._event("advanced", now, due=due)  # the figures of the step held
            self.step += 1
            self._step_started = now
            self.apply_step(now)
            return
        reg, plan = self.registry, self.plan
        reg.set_weight(plan.canary, self._stable_weight, "rollout finished", new=False)
        reg.drain(plan.stable, "drained")
        self.state = "finished"
        self._event("finished", now, due=due)

    def apply_step(self, now: float) -> None:
        pct = self.plan.steps[self.step]
        reg = self.registry
        reg.set_weight(self.plan.canary, pct, f"rollout {self.id}", new=False)
        reg.set_weight(self.plan.stable, 100.0 - pct, f"rollout {self.id}", new=False)

    def _unroutable(self, window: float, now: float) -> str | None:
        """A canary none of whose workers takes requests (down, or marked failed after its
        errors: then it gets no more samples to judge) fails after a short grace."""
        workers = self.registry.pool(self.plan.canary).workers.values()
        if any(w.routable(now) for w in workers):
            self._down_since = None
            return None
        if self._down_since is None:
            self._down_since = now
        grace = min(window, UNROUTABLE_GRACE_S)
        if now - self._down_since < grace:
            return None
        return f"no canary worker has been routable for {now - self._down_since:.1f} s"

    def _stable_baseline(self, window: float, now: float) -> WindowStats | None:
        stats = self.windows.window(self.plan.stable, window, now)
        if stats.requests >= self.plan.analysis.min_samples:
            self._baseline = stats
        return self._baseline

    # -- the operator ---------------------------------------------------------------------

    def pause(self, now: float) -> None:
        self._need("running", "pause")
        self.state = "paused"
        self._event("paused", now)

    def resume(self, now: float) -> None:
        self._need("paused", "resume")
        self.state = "running"
        self._step_started = now  # the hold starts again
        self._event("resumed", now)

    def abort(self, now: float) -> None:
        if not self.active:
            self._need("running", "abort")
        self._end("aborted", "aborted by the operator", now)

    def _need(self, state: str, verb: str) -> None:
        if self.state != state:
            raise ApiError(
                409, f"rollout {self.id} is {self.state}: cannot {verb} it", code="conflict"
            )

    def _end(self, state: str, reason: str, now: float) -> None:
        """Rolled back or aborted: the canary drains, the stable pool gets its weight back."""
        reg, plan = self.registry, self.plan
        if plan.canary in reg.pools:
            reg.drain(plan.canary, "rolled_back")
        if plan.stable in reg.pools:
            reg.set_weight(plan.stable, self._stable_weight, f"rollout {self.id}", new=False)
        self.state, self.reason = state, reason
        self._event(state, now, reason)

    # -- the fleet's copy (edge.release.fleet_rollouts) --------------------------------

    def to_state(self) -> dict[str, Any]:
        """Everything another process needs to go on with it (times on the wall clock)."""
        offset = time.time() - time.monotonic()
        base = self._baseline
        return {
            **self.describe(),
            "stable_weight": self._stable_weight,
            "step_started_at": self._step_started + offset,
            "baseline": None if base is None else dataclasses.astuple(base),
        }

    @classmethod
    def from_state(
        cls, state: dict[str, Any], registry: PoolRegistry, counts: dict[str, int], windows: Windows
    ) -> Rollout:
        """The rollout `to_state` described, in this process (nothing applied)."""
        self = cls.__new__(cls)
        self.id, self.registry, self.windows, self._counts = state["id"], registry, windows, counts
        self.plan = parse_plan(state["plan"])
        self.state, self.reason, self.step = state["state"], state["reason"] or "", state["step"]
        self.history, self.created_at = state["history"], state["created_at"]
        self._stable_weight = state["stable_weight"]
        self._step_started = state["step_started_at"] - (time.time() - time.monotonic())
        base = state["baseline"]
        self._baseline = None if base is None else WindowStats(*base)
        self._down_since = None
        return self

    def span(self, now: float) -> float:
        """How far back its judgement reads now (0 when it is over)."""
        if not self.active:
            return 0.0
        hold = self.plan.hold_s[self.step]
        return max(self.plan.analysis.window_s or hold or 1.0, now - self._step_started)

    # -- views ------------------------------------------------------------------------------

    def _event(self, event: str, now: float, reason: str = "", due: float | None = None) -> None:
        span = max(now - self._step_started, 1e-3)
        plan = self.plan
        entry: dict[str, Any] = {
            "at": time.time(),
            "event": event,
            "step": self.step,
            "percent": plan.steps[self.step],
            "reason": reason,
            "held_s": round(span, 3),
            "canary": self.windows.window(plan.canary, span, now).to_dict(),
            "stable": self.windows.window(plan.stable, span, now).to_dict(),
        }
        if due is not None:
            entry["applied_late_ms"] = round((now - due) * 1000, 1)
        self.history.append(entry)
        self._counts[event] = self._counts.get(event, 0) + 1
        logger = log.warning if event in ("rolled_back", "aborted") else log.info
        logger(
            "rollout %s (%s -> %s): %s at step %d (%g%%)%s",
            self.id,
            plan.stable,
            plan.canary,
            event,
            self.step,
            plan.steps[self.step],
            f": {reason}" if reason else "",
        )

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "reason": self.reason or None,
            "step": self.step,
            "percent": self.plan.steps[self.step],
            "created_at": self.created_at,
            "plan": self.plan.to_dict(),
            "history": self.history,
        }


def act(rollout: Rollout, action: str, now: float) -> None:
    """An operator's action on `rollout` (404 if there is no such action)."""
    if action == "pause":
        rollout.pause(now)
    elif action == "resume":
        rollout.resume(now)
    elif action == "abort":
        rollout.abort(now)
    else:
        raise ApiError(404, f"no rollout action {action!r}: pause, resume, abort", code="no_action")


class Rollouts:
    """The rollouts of this edge: at most one active at a time."""

    def __init__(self, registry: PoolRegistry, windows: Windows | None = None) -> None:
        self.registry = registry
        self.windows: Windows = windows or LocalWindows(registry)
        self.kept: OrderedDict[str, Rollout] = OrderedDict()
        self._seq = 0
        self.transitions: dict[str, int] = {}

    def start(self, plan: Plan, now: float | None = None, rid: str = "") -> Rollout:
        reg = self.registry
        busy = [r for r in self.kept.values() if r.active]
        if busy:
            raise ApiError(409, f"rollout {busy[0].id} is still {busy[0].state}", code="conflict")
        canary = reg.pool(plan.canary)
        if not canary.workers:
            raise PoolConfigError(f"pool {plan.canary!r} has no workers")
        if not plan.stable:
            others = [
                p.name
                for p in reg.pools.values()
                if p.name != plan.canary and p.weight > 0 and not p.draining
            ]
            if len(others) != 1:
                raise PoolConfigError(f"name the stable pool: candidates are {sorted(others)}")
            plan.stable = others[0]
        reg.pool(plan.stable)
        self._seq += 1
        rid = rid or f"{time.strftime('%Y%m%d-%H%M%S')}-{self._seq}"
        t = time.monotonic() if now is None else now
        rollout = Rollout(rid, plan, reg, self.transitions, t, self.windows)
        self.kept[rid] = rollout
        self.forget_old()
        return rollout

    def forget_old(self) -> None:
        while len(self.kept) > KEEP:
            old = next((k for k, r in self.kept.items() if not r.active), None)
            if old is None:
                break
            del self.kept[old]

    def get(self, rid: str) -> Rollout:
        rollout = self.kept.get(rid)
        if rollout is None:
            raise ApiError(404, f"no rollout {rid!r}", type="not_found_error", code="no_rollout")
        return rollout

    def active(self) -> Rollout | None:
        return next((r for r in self.kept.values() if r.active), None)

    def span(self, now: float | None = None) -> float:
        """How far back the active rollout's judgement reads (0: none running)."""
        active = self.active()
        return active.span(time.monotonic() if now is None else now) if active else 0.0

    def check(self, now: float | None = None) -> None:
        t = time.monotonic() if now is None else now
        for rollout in list(self.kept.values()):
            rollout.tick(t)

    async def watch(self) -> None:
        """Run `check` forever (started by the bootstrap's lifespan, a task of the registry)."""
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            try:
                self.check()
            except Exception:  # a bug here must not stop routing
                log.exception("rollout check failed")

    def describe(self) -> dict[str, Any]:
        active = self.active()
        rollouts = [r.describe() for r in reversed(self.kept.values())]
        return {"active": active.id if active else None, "rollouts": rollouts}

    # -- the admin API's interface (`edge.release.fleet_rollouts` has the same) ------------

    async def begin(self, plan: Plan) -> dict[str, Any]:
        return self.start(plan).describe()

    async def listing(self) -> dict[str, Any]:
        return self.describe()

    async def one(self, rid: str) -> dict[str, Any]:
        return self.get(rid).describe()

    async def act(self, rid: str, action: str) -> dict[str, Any]:
        rollout = self.get(rid)
        act(rollout, action, time.monotonic())
        return rollout.describe()

    def render_metrics(self) -> str:
        out = Exposition()
        shown = list(self.kept.values())[-1:]  # the latest rollout
        out.family(
            "sluice_edge_rollout_state",
            "gauge",
            "1 for the latest rollout's state (running, paused, finished, rolled_back, aborted).",
            [
                (labels(rollout=r.id, canary=r.plan.canary, state=s), int(r.state == s))
                for r in shown
                for s in STATES
            ],
        )
        out.family(
            "sluice_edge_rollout_canary_percent",
            "gauge",
            "The latest rollout's current step: the canary's % of new sessions.",
            [(labels(rollout=r.id, canary=r.plan.canary), r.plan.steps[r.step]) for r in shown],
        )
        out.family(
            "sluice_edge_rollout_transitions_total",
            "counter",
            "Rollout transitions by event (started, advanced, paused, resumed, finished, ...).",
            [(labels(event=e), n) for e, n in sorted(self.transitions.items())],
        )
        return out.text()
