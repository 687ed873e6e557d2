"""Rollout plans: parsing, the judgement against the stable pool, and the state machine
(driven with explicit clock values, outcomes recorded by hand; no channel is used)."""

from __future__ import annotations

from typing import Any

import pytest

from edge.config import RoutingConfig
from edge.errors import ApiError
from edge.obs.outcomes import WindowStats
from edge.release.plans import Analysis, judge, parse_plan
from edge.release.rollouts import Rollouts
from edge.routing.pools import PoolConfigError, PoolSpec
from edge.routing.registry import PoolRegistry
from edge.upstream.channel import ChannelFactory
from edge.upstream.worker import SERVING

T0 = 1000.0


def fleet() -> PoolRegistry:
    specs = [PoolSpec("v1", "1", 1.0, ["s1:1", "s2:1"]), PoolSpec("v2", "2", 0.0, ["c1:1"])]
    reg = PoolRegistry(specs, RoutingConfig(), ChannelFactory([]))  # type: ignore[arg-type]
    for w in reg.workers:
        w.status = SERVING
    return reg


def outcomes(reg: PoolRegistry, pool: str, at: float, n: int, code: str = "ok", ttft: float = 0.01):
    for i in range(n):
        reg.pool_metrics(pool).outcome(code, ttft, now=at + i * 0.01, itl_s=0.005)


def plan(**kw: Any) -> dict[str, Any]:
    return {
        "canary": "v2",
        "steps": [10, 50, 100],
        "hold_s": 5,
        "analysis": {"min_samples": 4},
        **kw,
    }


def weights(reg: PoolRegistry) -> dict[str, float]:
    return {p.name: p.weight for p in reg.pools.values()}


def events(r: Any) -> list[tuple[str, int]]:
    return [(e["event"], e["step"]) for e in r.history]


async def test_a_healthy_canary_goes_step_by_step_to_100_and_takes_over() -> None:
    reg = fleet()
    rollouts = Rollouts(reg)
    r = rollouts.start(parse_plan(plan()), now=T0)
    assert r.plan.stable == "v1"  # the one other pool with traffic
    assert weights(reg) == {"v1": 90, "v2": 10}
    outcomes(reg, "v1", T0, 20)
    outcomes(reg, "v2", T0 + 1, 4)
    rollouts.check(T0 + 4.9)
    assert r.step == 0  # held for less than hold_s
    rollouts.check(T0 + 5.0)
    assert (r.step, weights(reg)) == (1, {"v1": 50, "v2": 50})
    assert r.history[-1]["applied_late_ms"] == 0.0
    rollouts.check(T0 + 11)
    assert r.step == 1  # held long enough, but no samples in this step yet
    outcomes(reg, "v2", T0 + 11.5, 4)
    rollouts.check(T0 + 12)
    assert (r.step, weights(reg)) == (2, {"v1": 0, "v2": 100})
    # It was due when the 4th sample came (11.53), not at the hold's end (10).
    assert r.history[-1]["applied_late_ms"] == pytest.approx(470, abs=1)
    outcomes(reg, "v2", T0 + 13, 4)
    rollouts.check(T0 + 17)
    assert r.state == "finished"
    assert events(r) == [("started", 0), ("advanced", 0), ("advanced", 1), ("finished", 2)]
    # The canary takes the stable pool's old weight; the old stable pool drains.
    assert weights(reg) == {"v1": 0, "v2": 1}
    assert reg.pool("v1").draining == "drained" and reg.refuses_pin("v1") == "drained"
    assert rollouts.transitions == {"started": 1, "advanced": 2, "finished": 1}
    text = rollouts.render_metrics()
    assert f'sluice_edge_rollout_state{{rollout="{r.id}",canary="v2",state="finished"}} 1' in text


async def test_errors_above_the_stable_pools_roll_back_at_once() -> None:
    reg = fleet()
    rollouts = Rollouts(reg)
    r = rollouts.start(parse_plan(plan()), now=T0)
    outcomes(reg, "v1", T0, 20)
    outcomes(reg, "v2", T0 + 0.5, 3, code="upstream_error")
    rollouts.check(T0 + 1)
    assert r.state == "running"  # 3 < min_samples: no verdict yet
    outcomes(reg, "v2", T0 + 1.5, 1, code="upstream_error")
    rollouts.check(T0 + 2)  # long before the hold ends
    assert r.state == "rolled_back" and "error rate 100.0%" in r.reason
    assert weights(reg) == {"v1": 1, "v2": 0}
    assert reg.pool("v2").draining == "rolled_back"  # its pinned sessions move back
    assert r.history[-1]["canary"]["errors"] == 4
    rollouts.check(T0 + 30)
    assert events(r) == [("started", 0), ("rolled_back", 0)]


async def test_a_slow_canary_is_rolled_back_and_a_new_plan_may_start() -> None:
    reg = fleet()
    rollouts = Rollouts(reg)
    r = rollouts.start(parse_plan(plan()), now=T0)
    with pytest.raises(ApiError) as busy:
        rollouts.start(parse_plan(plan()), now=T0)
    assert busy.value.status == 409
    outcomes(reg, "v1", T0, 20, ttft=0.010)
    outcomes(reg, "v2", T0 + 1, 4, ttft=0.500)
    rollouts.check(T0 + 2)
    assert r.state == "rolled_back" and r.reason.startswith("p99 TTFT 500.0 ms vs stable 10.0 ms")
    again = rollouts.start(parse_plan(plan()), now=T0 + 3)
    assert again.state == "running" and reg.pool("v2").draining == ""
    assert rollouts.describe()["active"] == again.id


async def test_pause_holds_resume_restarts_the_hold_abort_rolls_back() -> None:
    reg = fleet()
    rollouts = Rollouts(reg)
    r = rollouts.start(parse_plan(plan()), now=T0)
    outcomes(reg, "v1", T0, 20)
    outcomes(reg, "v2", T0 + 1, 4)
    r.pause(T0 + 2)
    rollouts.check(T0 + 9)
    assert (r.state, r.step) == ("paused", 0)
    with pytest.raises(ApiError):
        r.pause(T0 + 9)
    r.resume(T0 + 10)
    rollouts.check(T0 + 14)
    assert r.step == 0  # the hold started again at resume
    outcomes(reg, "v2", T0 + 14, 4)
    rollouts.check(T0 + 15)
    assert r.step == 1
    r.abort(T0 + 16)
    assert r.state == "aborted" and weights(reg) == {"v1": 1, "v2": 0}
    with pytest.raises(ApiError) as late:
        r.resume(T0 + 17)
    assert late.value.status == 409
    assert [e for e, _ in events(r)] == [
        "started",
        "paused",
        "resumed",
        "advanced",
        "aborted",
    ]


async def test_a_canary_with_no_routable_worker_is_rolled_back() -> None:
    """Passive failure marking takes a failing worker out; then it gets no samples."""
    reg = fleet()
    rollouts = Rollouts(reg)
    r = rollouts.start(parse_plan(plan()), now=T0)
    worker = reg.pool("v2").workers["c1:1"]
    worker.failed(T0)  # max_fails 1: out for fail_timeout (on the test's clock)
    rollouts.check(T0 + 0.5)
    assert r.state == "running"  # a short grace
    rollouts.check(T0 + 1.6)
    assert r.state == "rolled_back" and "no canary worker" in r.reason


async def test_removing_a_pool_ends_its_rollout() -> None:
    reg = fleet()
    rollouts = Rollouts(reg)
    r = rollouts.start(parse_plan(plan()), now=T0)
    reg.remove_pool("v2")
    rollouts.check(T0 + 1)
    assert r.state == "aborted" and r.reason == "pool v2 was removed"
    assert weights(reg) == {"v1": 1}
    await reg.close()


def test_judge_is_relative_to_the_stable_pool() -> None:
    a = Analysis(min_samples=10, max_error_rate_increase=0.05, latency_slack_ms=20)
    stable = WindowStats(100, 10, 0.01, 0.100, 0.010)
    assert judge(a, WindowStats(9, 9, None, None), stable) is None  # too few
    assert judge(a, WindowStats(20, 3, 0.01, 0.1, 0.01), stable) is None  # 15% vs 10%
    assert "error rate" in str(judge(a, WindowStats(20, 4, 0.01, 0.1, 0.01), stable))
    # Latency: over the ratio *and* the slack.
    assert judge(a, WindowStats(20, 0, 0.01, 0.119, 0.010), stable) is None
    assert "p99 TTFT" in str(judge(a, WindowStats(20, 0, 0.01, 0.151, 0.010), stable))
    assert judge(a, WindowStats(20, 0, 0.01, 0.1, 0.025), stable) is None  # 2.5x, +15 ms
    assert "inter-token" in str(judge(a, WindowStats(20, 0, 0.01, 0.1, 0.031), stable))
    # No baseline yet: errors against 0, no latency bound.
    assert judge(a, WindowStats(20, 0, 0.01, 9.0, 9.0), None) is None
    assert judge(a, WindowStats(20, 2, 0.01, 0.1, 0.01), None) is not None


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ([], "object"),
        ({"steps": [100]}, "canary"),
        ({"canary": "v2", "stable": "v2"}, "different"),
        ({"canary": "v2", "steps": [50, 10, 100]}, "rise"),
        ({"canary": "v2", "steps": [10, 50]}, "last step must be 100"),
        ({"canary": "v2", "steps": [0, 100]}, "above 0"),
        ({"canary": "v2", "steps": [10, 200]}, "between"),
        ({"canary": "v2", "steps": ["x", 100]}, "number"),
        ({"canary": "v2", "steps": []}, "list"),
        ({"canary": "v2", "hold_s": [1, 2]}, "one number per step"),
        ({"canary": "v2", "hold_s": -1}, "between"),
        ({"canary": "v2", "analysis": {"min_samples": 0}}, "between"),
        ({"canary": "v2", "analysis": {"typo": 1}}, "unknown analysis"),
        ({"canary": "v2", "colour": "red"}, "unknown rollout"),
    ],
)
def test_bad_plans_are_refused(raw: Any, fragment: str) -> None:
    with pytest.raises(PoolConfigError, match=fragment):
        parse_plan(raw)


async def test_defaults_and_the_stable_pool_must_be_clear() -> None:
    p = parse_plan({"canary": "v2"})
    assert (p.steps, p.hold_s, p.analysis.min_samples) == ([1, 5, 25, 50, 100], [60.0] * 5, 20)
    reg = fleet()
    reg.add_pool(PoolSpec("v0", "0", 1.0, ["o1:1"]))
    with pytest.raises(PoolConfigError, match="name the stable pool"):
        Rollouts(reg).start(parse_plan({"canary": "v2"}), now=T0)
    with pytest.raises(ApiError) as unknown:
        Rollouts(reg).start(parse_plan({"canary": "nope"}), now=T0)
    assert unknown.value.status == 404
