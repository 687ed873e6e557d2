"""Pools without processes: config files, the registry's choices, passive health, canary
verdicts, window statistics, admin authorization, continuation requests."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from edge.config import RoutingConfig
from edge.errors import ApiError
from edge.obs.outcomes import PoolMetrics, WindowStats, expose, percentile
from edge.obs.prom import Exposition
from edge.release import canary
from edge.routing.pools import (
    PoolConfigError,
    PoolSpec,
    RollbackSpec,
    build_pools,
    load_pools,
    parse_pool,
)
from edge.routing.registry import PoolRegistry
from edge.security.auth import ADMIN, AuthMiddleware, KeyStore, bearer
from edge.upstream.channel import ChannelFactory
from edge.upstream.continuation import continuation_start, may_continue, split_id
from edge.upstream.worker import NOT_SERVING, SERVING, UNREACHABLE, PassiveHealth
from generated import sluice_pb2 as pb

EXAMPLE = Path(__file__).resolve().parents[2] / "edge" / "pools.example.toml"

# -- configuration -------------------------------------------------------------------


def test_example_file_parses() -> None:
    pools = load_pools(str(EXAMPLE))
    assert [p.name for p in pools] == ["stable", "canary"]
    assert pools[1].weight == 5 and pools[1].version == "v2"
    assert pools[1].rollback is not None and pools[1].rollback.min_requests == 50


def test_json_file_and_worker_flags(tmp_path: Path) -> None:
    path = tmp_path / "pools.json"
    path.write_text(json.dumps({"pools": [{"name": "a", "workers": ["h:1"], "weight": 2}]}))
    pools = build_pools(str(path), ["h:2"])
    assert [(p.name, p.workers, p.weight) for p in pools] == [
        ("a", ["h:1"], 2.0),
        ("default", ["h:2"], 1.0),
    ]


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"name": "", "workers": []}, "name"),
        ({"name": "a", "weight": -1}, "weight"),
        ({"name": "a", "weight": "x"}, "weight"),
        ({"name": "a", "colour": "red"}, "unknown"),
        ({"name": "a", "workers": "h:1"}, "workers"),
        ({"name": "a", "rollback": {"window_s": 5}}, "max_error_rate"),
        ({"name": "a", "rollback": {"max_error_rate": 0.1, "typo": 1}}, "unknown"),
    ],
)
def test_bad_pools_are_refused(raw: dict[str, object], fragment: str) -> None:
    with pytest.raises(PoolConfigError, match=fragment):
        parse_pool(raw)


def test_clashes_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps([{"name": "a", "workers": ["h:1"]}, {"name": "a"}]))
    with pytest.raises(PoolConfigError, match="twice"):
        build_pools(str(path), [])
    path.write_text(json.dumps([{"name": "a", "workers": ["h:1"]}]))
    with pytest.raises(PoolConfigError, match="more than one pool"):
        build_pools(str(path), ["h:1"])
    with pytest.raises(PoolConfigError, match="no worker"):
        build_pools("", [])


# -- the registry's choices (no channel is used: statuses are set by hand) ---------------


def registry(*specs: PoolSpec, **opts: object) -> PoolRegistry:
    reg = PoolRegistry(list(specs), RoutingConfig(**opts), ChannelFactory([]))  # type: ignore[arg-type]
    for w in reg.workers:
        w.status = SERVING
    return reg


async def test_keys_stick_and_pools_follow_weights() -> None:
    reg = registry(
        PoolSpec("stable", "v1", 3.0, ["s1:1", "s2:1"]), PoolSpec("canary", "v2", 1.0, ["c1:1"])
    )
    keys = [f"k{i}" for i in range(2000)]
    first = {k: reg.pick(key=k).address for k in keys}
    assert first == {k: reg.pick(key=k).address for k in keys}  # sticky
    share = sum(a == "c1:1" for a in first.values()) / len(keys)
    assert abs(share - 0.25) < 0.04
    reg.set_weight("canary", 0.0)
    assert all(reg.pick(key=k).pool == "stable" for k in keys[:200])
    reg.set_weight("canary", 1.0)
    assert {k: reg.pick(key=k).address for k in keys} == first  # weights back: same map


async def test_exclusions_passive_marks_and_removal() -> None:
    reg = registry(PoolSpec("p", "", 1.0, ["a:1", "b:1", "c:1"]), max_fails=2)
    a = reg.find_worker("a:1")
    assert a is not None
    # A failover never returns a worker already tried.
    assert reg.pick(exclude={"a:1", "b:1"}).address == "c:1"
    with pytest.raises(ApiError) as info:
        reg.pick(exclude={"a:1", "b:1", "c:1"})
    assert info.value.status == 503
    # Two failures take a worker out; one does not.
    a.failed()
    assert a.routable()
    a.failed()
    assert not a.routable()
    assert all(reg.pick().address != "a:1" for _ in range(50))
    # Health coming back as SERVING after an outage clears the marks.
    a._set_status(UNREACHABLE)
    a._set_status(SERVING)
    assert a.routable()
    # A removed worker gets nothing new; it stays findable for resumes while it drains.
    a.in_flight = 1
    reg.remove_worker("p", "a:1")
    assert all(reg.pick().address != "a:1" for _ in range(50))
    assert reg.find(a.key) is a
    a.in_flight = 0
    reg.released(a)
    with pytest.raises(ApiError) as lost:
        reg.find(a.key)
    assert lost.value.status == 410
    await reg.close()


async def test_not_serving_and_passive_fallback() -> None:
    reg = registry(PoolSpec("p", "", 1.0, ["a:1", "b:1"]), max_fails=1)
    a, b = reg.find_worker("a:1"), reg.find_worker("b:1")
    assert a is not None and b is not None
    a.status = NOT_SERVING
    assert {reg.pick().address for _ in range(20)} == {"b:1"}
    b.failed()  # every SERVING worker marked: still try them (as nginx does)
    assert reg.pick().address == "b:1"
    b.status = UNREACHABLE
    with pytest.raises(ApiError):
        reg.pick()


async def test_load_decides_without_a_key() -> None:
    reg = registry(PoolSpec("p", "", 1.0, ["a:1", "b:1"]))
    busy = reg.find_worker("a:1")
    assert busy is not None
    busy.in_flight = 10
    assert Counter(reg.pick().address for _ in range(100)) == {"b:1": 100}


async def test_prefer_pool_keeps_a_failover_in_its_pool() -> None:
    reg = registry(PoolSpec("x", "", 1.0, ["x1:1", "x2:1"]), PoolSpec("y", "", 100.0, ["y1:1"]))
    for _ in range(20):
        assert reg.pick(exclude={"x1:1"}, prefer_pool="x").address == "x2:1"
    assert reg.pick(exclude={"x1:1", "x2:1"}, prefer_pool="x").address == "y1:1"


async def test_runtime_changes_are_checked() -> None:
    reg = registry(PoolSpec("p", "", 1.0, ["a:1"]))
    with pytest.raises(ApiError) as info:
        reg.add_worker("p", "a:1")
    assert info.value.status == 409
    with pytest.raises(ApiError) as bad:
        reg.add_worker("p", "no-port")
    assert bad.value.status == 400
    with pytest.raises(ApiError) as missing:
        reg.set_weight("nope", 1.0)
    assert missing.value.status == 404
    reg.add_pool(PoolSpec("q", "v9", 0.0, ["b:1"]))
    assert [p["name"] for p in reg.describe()["pools"]] == ["p", "q"]  # type: ignore[index]
    await reg.close()


# -- passive health, windows, canary verdicts --------------------------------------------


def test_passive_health_counts_within_the_timeout() -> None:
    ph = PassiveHealth(max_fails=3, fail_timeout_s=10)
    assert not ph.failure(0.0) and not ph.failure(5.0)
    assert not ph.failure(11.0)  # the first one expired: only two within 10 s
    assert ph.failure(12.0) and not ph.available(12.0)
    assert ph.available(22.0)
    off = PassiveHealth(max_fails=0, fail_timeout_s=10)
    assert not any(off.failure(t) for t in range(10))


def test_window_error_rate_and_percentiles() -> None:
    m = PoolMetrics()
    for i in range(100):
        m.outcome("ok", ttft_s=i / 1000, now=float(i))
    m.outcome("unavailable", None, now=100.0)
    m.outcome("cancelled", None, now=100.0)  # neither success nor error
    w = m.window(window_s=1000, now=100.0)
    assert (w.requests, w.errors) == (101, 1)
    assert w.ttft_p50_s == pytest.approx(0.049) and w.ttft_p99_s == pytest.approx(0.098)
    assert m.window(window_s=10, now=100.0).requests == 11  # t >= 90 only
    assert percentile([], 0.5) is None
    out = Exposition()
    expose(out, {"p": m})
    text = out.text()
    assert 'sluice_edge_pool_requests_total{pool="p",outcome="unavailable"} 1' in text


def test_canary_verdict_is_relative_and_needs_samples() -> None:
    spec = RollbackSpec(max_error_rate=0.1, min_requests=20)
    bad = WindowStats(requests=30, errors=15, ttft_p50_s=None, ttft_p99_s=None)
    healthy_rest = WindowStats(requests=300, errors=3, ttft_p50_s=None, ttft_p99_s=None)
    same_rest = WindowStats(requests=300, errors=140, ttft_p50_s=None, ttft_p99_s=None)
    assert canary.verdict(spec, bad, healthy_rest) is not None
    assert canary.verdict(spec, bad, same_rest) is None  # clients' own errors, everywhere
    few = WindowStats(requests=10, errors=10, ttft_p50_s=None, ttft_p99_s=None)
    assert canary.verdict(spec, few, healthy_rest) is None
    slow = RollbackSpec(max_p99_ttft_s=0.5, min_requests=5)
    laggard = WindowStats(requests=10, errors=0, ttft_p50_s=0.1, ttft_p99_s=0.9)
    assert "TTFT" in (canary.verdict(slow, laggard, healthy_rest) or "")


async def test_canary_check_rolls_back_once() -> None:
    reg = registry(
        PoolSpec("stable", "", 1.0, ["s:1"]),
        PoolSpec("canary", "", 1.0, ["c:1"], RollbackSpec(max_error_rate=0.2, min_requests=5)),
    )
    for _ in range(10):
        reg.pool_metrics("canary").outcome("invalid_value", None)
        reg.pool_metrics("stable").outcome("ok", 0.01)
    assert canary.check(reg) == ["canary"]
    assert reg.pool("canary").weight == 0 and reg.pool_metrics("canary").rollbacks == 1
    assert canary.check(reg) == []  # weight 0: nothing more to do
    await reg.close()


# -- admin authorization, continuation ----------------------------------------------------


def authorize(header: str | None, key: str) -> ApiError | None:
    """The one admin-key check (edge.security.auth) for `GET /admin/pools`."""
    auth = AuthMiddleware(None, KeyStore([]), key, {})  # type: ignore[arg-type]
    headers = [] if header is None else [(b"authorization", header.encode())]
    scope = {"type": "http", "path": "/admin/pools", "headers": headers}
    return auth._check(ADMIN, bearer(scope), scope)


def test_admin_authorization() -> None:
    # No key: the admin routes are not installed at all (404: test_edge_pools), and
    # authentication lets the request reach the router.
    assert authorize("Bearer s3cret", "") is None
    missing = authorize(None, "s3cret")
    assert missing is not None and missing.status == 401
    wrong = authorize("Bearer nope", "s3cret")
    assert wrong is not None and wrong.status == 403
    assert authorize("Basic s3cret", "s3cret") is not None
    assert authorize("Bearer s3cret", "s3cret") is None
    assert authorize("bearer  s3cret ", "s3cret") is None


def test_continuation_policy() -> None:
    def start(**sampling: object) -> pb.StartGeneration:
        return pb.StartGeneration(prompt="p", sampling=pb.SamplingParams(**sampling))

    sampled = start(temperature=0.7)
    greedy = start(temperature=0)
    seeded = start(temperature=0.7, seed=3)
    default = start()  # temperature unset = 1.0
    assert may_continue("sampled", sampled) and may_continue("sampled", default)
    assert not may_continue("sampled", greedy) and not may_continue("sampled", seeded)
    assert may_continue("always", greedy) and may_continue("always", seeded)
    assert not may_continue("never", sampled)


def test_constrained_generations_are_never_continued() -> None:
    json_out = pb.StartGeneration(
        prompt="p", structured_output=pb.StructuredOutput(json_object=True)
    )
    several = pb.StartGeneration(prompt="p", sampling=pb.SamplingParams(n=2))
    tools = pb.StartGeneration()
    tools.chat.messages.add(role="user", content="hi")
    tools.chat.tools.add(name="f")
    no_calls = pb.StartGeneration()
    no_calls.CopyFrom(tools)
    no_calls.chat.tool_choice.mode = pb.TOOL_MODE_NONE
    for start in (json_out, several, tools):
        assert not may_continue("always", start)
    assert may_continue("always", no_calls)  # tools shown, plain text out


def test_continuation_start_chat_and_prompt() -> None:
    chat = pb.StartGeneration(request_id="r", sampling=pb.SamplingParams(max_tokens=50))
    chat.sampling.min_tokens = 30
    chat.chat.messages.add(role="user", content="hi")
    cont = continuation_start(chat, " the river", 2, 1)
    assert cont.request_id == "r-c1-2"  # the stream's id, the continuation, tokens before it
    assert split_id(cont.request_id) == ("r", 2) and split_id("r") == ("r", 0)
    assert [(m.role, m.content) for m in cont.chat.messages] == [
        ("user", "hi"),
        ("assistant", " the river"),
    ]
    assert cont.chat.HasField("add_generation_prompt") and not cont.chat.add_generation_prompt
    assert (cont.sampling.max_tokens, cont.sampling.min_tokens) == (48, 28)
    assert len(chat.chat.messages) == 1  # the original is untouched
    raw = pb.StartGeneration(request_id="r", prompt="Once")
    cont2 = continuation_start(raw, " upon", 1, 2)
    assert cont2.prompt == "Once upon" and not cont2.sampling.HasField("max_tokens")


def test_continuation_of_template_controlled_chats() -> None:
    """A prefill (continue_final_message) continues by growing its final message; a
    reply in the final message's role (no generation prompt, not continuing) has no text
    to extend and is not continued; a closed-turn default continues as an open one."""
    prefill = pb.StartGeneration(request_id="r")
    prefill.chat.messages.add(role="user", content="hi")
    prefill.chat.messages.add(role="assistant", content="The")
    prefill.chat.add_generation_prompt, prefill.chat.continue_final_message = False, True
    cont = continuation_start(prefill, " river", 1, 1)
    assert [(m.role, m.content) for m in cont.chat.messages] == [
        ("user", "hi"),
        ("assistant", "The river"),
    ]
    closed = pb.StartGeneration()
    closed.CopyFrom(prefill)
    closed.chat.continue_final_message = False
    explicit = pb.StartGeneration()
    explicit.CopyFrom(prefill)
    explicit.chat.messages.pop()
    explicit.chat.add_generation_prompt, explicit.chat.continue_final_message = True, False
    opened = continuation_start(explicit, " The", 1, 1).chat
    assert [may_continue("always", s) for s in (prefill, closed, explicit)] == [True, False, True]
    assert (opened.add_generation_prompt, opened.continue_final_message) == (False, True)


async def test_metrics_text_groups_each_family() -> None:
    """Prometheus wants every sample of a family right after its TYPE line."""
    reg = registry(PoolSpec("p", "", 1.0, ["a:1", "b:1"]), PoolSpec("q", "", 2.0, ["c:1"]))
    reg.pool_metrics("p").outcome("ok", 0.02)
    reg.pool_metrics("p").itl.observe(0.004, 3)
    text = reg.render_metrics()
    families: list[str] = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            families.append(line.split()[2])
        elif line and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            base = name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
            assert base == families[-1] or name == families[-1], line
    assert len(families) == len(set(families))
    assert 'sluice_edge_worker_routable{pool="q",worker="c:1"' in text
    assert 'sluice_edge_pool_inter_token_seconds_count{pool="p"} 3' in text
    await reg.close()
