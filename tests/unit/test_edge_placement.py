"""Worker choice within a pool, as pure functions and through the registry: the prefix
index, the cache_aware score and its balance threshold, the other policies, pushed load."""

from __future__ import annotations

import random
from collections import Counter
from typing import NamedTuple

import pytest

from edge.config import RoutingConfig
from edge.routing.pools import PoolConfigError, PoolSpec, parse_pool
from edge.routing.prefix import MAX_BLOCKS, PrefixIndex, Prompt, block_hashes
from edge.routing.registry import PoolRegistry
from edge.routing.scores import CacheAware, cache_aware, least_loaded
from edge.upstream.channel import ChannelFactory
from edge.upstream.worker import NOT_SERVING, SERVING
from generated import sluice_pb2 as pb

SYSTEM = "You are a careful assistant. " * 40  # ~1,100 characters: several blocks


class W(NamedTuple):
    """A worker as the index sees it."""

    key: str
    epoch: int


# -- prompt blocks and the index -----------------------------------------------------


def test_a_next_turn_shares_every_full_block_of_the_last_one() -> None:
    turn1 = [("system", SYSTEM), ("user", "What is a river?")]
    turn2 = [*turn1, ("assistant", "Water that flows."), ("user", "And a lake?")]
    a, b = Prompt(turn1).blocks(128), Prompt(turn2).blocks(128)
    full = len(Prompt(turn1).text()) // 128
    assert len(a) == full + 1  # full blocks, then one partial one
    assert a[:full] == b[:full] and a[full] != b[full]
    other = Prompt([("system", "x" + SYSTEM[1:]), *turn1[1:]]).blocks(128)
    assert not set(other) & set(a)  # chained: a change up front changes every block
    moved = Prompt([("system", SYSTEM[:-1]), ("user", SYSTEM[-1] + "What is a river?")])
    assert moved.blocks(128)[-1] != a[-1]  # roles are part of the blocks
    assert Prompt(prompt="hi").blocks(64) == block_hashes("hi", 64)
    assert block_hashes("", 8) == [] and Prompt([]).blocks(8) == []


def test_only_the_first_blocks_of_a_long_prompt_count() -> None:
    long = Prompt(prompt="x" * (64 * MAX_BLOCKS * 3))
    assert len(long.blocks(64)) == MAX_BLOCKS
    assert long.blocks(64) == Prompt(prompt="x" * (64 * MAX_BLOCKS)).blocks(64)
    chat = [("system", "s" * 900), *[("user", f"{i} " + "u" * 100) for i in range(40)]]
    head = chat[: 1 + (64 * MAX_BLOCKS - 900) // 100 + 1]  # what the first blocks hold
    assert Prompt(chat).blocks(64) == Prompt(head).blocks(64)
    assert len(Prompt(chat).text(64 * MAX_BLOCKS)) < len(Prompt(chat).text())


def test_the_prompt_is_hashed_once_per_block_size() -> None:
    p = Prompt(prompt="abc" * 100)
    assert p.blocks(16) is p.blocks(16)
    assert len(p.blocks(100)) == 3


def test_match_counts_leading_blocks_per_worker() -> None:
    idx = PrefixIndex()
    blocks = list(range(1, 11))
    idx.add(blocks[:6], "a", 1, capacity=100)
    idx.add(blocks[:3], "b", 1, capacity=100)
    idx.add(blocks, "c", 1, capacity=100)
    assert idx.match(blocks, [W("a", 1), W("b", 1), W("c", 1), W("new", 1)]) == [6, 3, 10, 0]
    assert idx.match([99, *blocks], [W("a", 1), W("c", 1)]) == [0, 0]
    assert idx.match([], [W("a", 1)]) == [0]


def test_each_worker_keeps_its_most_recent_blocks_within_its_capacity() -> None:
    idx = PrefixIndex()
    idx.add([1, 2, 3], "a", 1, capacity=4)
    idx.add([7, 8], "a", 1, capacity=4)  # 1 is the oldest: it goes
    assert idx.held("a") == 4
    assert idx.match([1, 2, 3], [W("a", 1)]) == [0]
    idx.add([2, 3], "a", 1, capacity=4)  # refreshed: now 7 is the oldest
    idx.add([9], "a", 1, capacity=4)
    assert idx.match([2, 3], [W("a", 1)]) == [2] and idx.match([7], [W("a", 1)]) == [0]
    idx.add([1, 2, 3], "b", 1, capacity=10)
    assert idx.match([1, 2, 3], [W("a", 1), W("b", 1)]) == [0, 3]


def test_a_restarted_worker_is_forgotten_and_its_bit_reused() -> None:
    idx = PrefixIndex()
    idx.add([1, 2], "a", epoch=1, capacity=10)
    assert idx.match([1, 2], [W("a", 2)]) == [0]  # a new epoch: its cache is gone
    assert len(idx) == 0
    idx.add([5], "b", 1, capacity=10)  # takes a's freed bit: no stale hit for b
    assert idx.match([1, 2], [W("b", 1)]) == [0] and idx.match([5], [W("b", 1)]) == [1]
    idx.forget("b")
    assert len(idx) == 0 and idx.held("b") == 0


# -- the score -----------------------------------------------------------------------

P = CacheAware(load_weight=0.5, balance_abs=4, balance_rel=1.5)


def test_the_worker_holding_the_prefix_wins_at_equal_load() -> None:
    rng = random.Random(1)
    assert cache_aware([2, 9, 0], 10, [3, 3, 3], P, rng) == (1, "cache")


def test_no_hit_anywhere_goes_to_the_least_loaded() -> None:
    rng = random.Random(1)
    assert cache_aware([0, 0, 0], 10, [5, 1, 3], P, rng) == (1, "load")
    assert cache_aware([0, 0], 0, [2, 1], P, rng) == (1, "load")  # an empty prompt


def test_load_outweighs_a_small_hit() -> None:
    rng = random.Random(1)
    # 1 of 10 blocks on a worker with 4 more in flight than an idle one (mean 2).
    assert cache_aware([1, 0], 10, [4, 0], P, rng) == (1, "load")
    # The whole prompt on it: the hit wins.
    assert cache_aware([10, 0], 10, [4, 0], P, rng) == (0, "cache")


def test_the_balance_threshold_spreads_a_hot_prefix() -> None:
    rng = random.Random(1)
    heavy = CacheAware(load_weight=0.01, balance_abs=4, balance_rel=1.5)  # the score alone
    assert cache_aware([10, 2, 0], 10, [12, 2, 2], heavy, rng) == (1, "balance")
    # Within the threshold the hit stays where it is.
    assert cache_aware([10, 2, 0], 10, [6, 2, 2], heavy, rng) == (0, "cache")
    assert cache_aware([10, 2, 0], 10, [12, 9, 9], heavy, rng) == (0, "cache")  # not 1.5x


def test_ties_are_broken_at_random() -> None:
    rng = random.Random(3)
    picks = Counter(cache_aware([0, 0, 0, 0], 5, [1, 1, 1, 1], P, rng)[0] for _ in range(400))
    assert set(picks) == {0, 1, 2, 3}
    picks = Counter(least_loaded([2, 0, 0, 5], rng) for _ in range(400))
    assert set(picks) == {1, 2}


# -- through the registry --------------------------------------------------------------


def registry(*specs: PoolSpec, **opts: object) -> PoolRegistry:
    config = RoutingConfig(**opts)  # type: ignore[arg-type]
    reg = PoolRegistry(list(specs), config, ChannelFactory([]), rng=random.Random(7))
    for w in reg.workers:
        w.status = SERVING
        w.epoch = 1
    return reg


def chat(system: str, *turns: str) -> Prompt:
    return Prompt([("system", system), *(("user", t) for t in turns)])


async def test_a_conversation_follows_its_prefix_and_new_ones_spread() -> None:
    reg = registry(PoolSpec("p", "", 1.0, ["a:1", "b:1", "c:1", "d:1"], policy="cache_aware"))
    firsts = {}
    for i in range(8):
        w = reg.pick(prompt=chat(f"{i} {SYSTEM}", "hello"))
        w.in_flight += 1  # the conversation's first turn is still running
        firsts[i] = w
    assert len({w.address for w in firsts.values()}) == 4  # by load: two each
    for i, w in firsts.items():
        assert reg.pick(prompt=chat(f"{i} {SYSTEM}", "hello", "more")) is w
    decisions = reg.pools["p"].placement.decisions
    assert decisions["cache"] == 8 and decisions["load"] == 8


async def test_a_session_key_still_wins_in_a_cache_aware_pool() -> None:
    reg = registry(PoolSpec("p", "", 1.0, ["a:1", "b:1", "c:1"], policy="cache_aware"))
    prompt = chat(SYSTEM, "hi")
    first = reg.pick(prompt=prompt)
    keyed = {reg.pick(key=f"k{i}", prompt=prompt).address for i in range(30)}
    assert len(keyed) == 3  # rendezvous by key, not by the cached prefix
    fresh = registry(PoolSpec("p", "", 1.0, ["a:1", "b:1", "c:1"], policy="session"))
    assert {f"k{i}": reg.pick(key=f"k{i}").address for i in range(30)} == {
        f"k{i}": fresh.pick(key=f"k{i}").address for i in range(30)
    }
    assert reg.pick(prompt=prompt) is first


async def test_a_saturated_worker_sheds_its_hot_prefix() -> None:
    reg = registry(PoolSpec("p", "", 1.0, ["a:1", "b:1"], policy="cache_aware"))
    hot = chat(SYSTEM, "the same question")
    first = reg.pick(prompt=hot)
    first.in_flight = 10
    other = reg.pick(prompt=hot)
    assert other is not first
    placement = reg.pools["p"].placement
    assert placement.decisions == {"load": 1, "balance": 1}  # no hit yet; then the threshold
    blocks = hot.blocks(reg.options.prefix_block_chars)
    held = placement.index.match(blocks, [W(first.key, 1), W(other.key, 1)])
    assert held == [len(blocks)] * 2  # both hold it now


async def test_pushed_load_and_this_edges_calls_since_make_the_load() -> None:
    reg = registry(PoolSpec("p", "", 1.0, ["a:1"]))
    w = reg.workers[0]
    w.in_flight = 2
    assert w.load == 2
    w.loaded(pb.WorkerLoad(running=5, waiting=3, kv_cache_tokens=1000))
    assert w.load == 8
    w.in_flight += 2  # two more picked since the push
    assert w.load == 10
    w.in_flight = 0  # all of ours ended: the others' 6 remain
    assert w.load == 6
    w.loaded(pb.WorkerLoad(running=0, draining=True))
    assert w.load == 0 and not w.serving


async def test_least_load_and_random_policies() -> None:
    reg = registry(
        PoolSpec("p", "", 1.0, ["a:1", "b:1", "c:1"], policy="least_load"),
    )
    a, b, c = reg.workers
    a.loaded(pb.WorkerLoad(running=4))
    b.loaded(pb.WorkerLoad(running=1))
    c.loaded(pb.WorkerLoad(running=2))
    assert {reg.pick().address for _ in range(20)} == {"b:1"}
    rnd = registry(PoolSpec("p", "", 1.0, ["a:1", "b:1", "c:1"]), policy="random")
    rnd.workers[0].in_flight = 100
    assert len({rnd.pick().address for _ in range(60)}) == 3  # load ignored


async def test_the_index_is_sized_by_the_workers_kv_cache() -> None:
    reg = registry(PoolSpec("p", "", 1.0, ["a:1"], policy="cache_aware"), prefix_block_chars=64)
    w = reg.workers[0]
    placement = reg.pools["p"].placement
    assert placement.capacity(w) == 4096
    w.loaded(pb.WorkerLoad(kv_cache_tokens=80))  # 320 characters, twice: 10 blocks
    assert placement.capacity(w) == 10
    reg.pick(prompt=Prompt(prompt="x" * 64 * 30))
    assert placement.index.held(w.key) == 10


async def test_removal_and_restart_forget_the_workers_blocks() -> None:
    reg = registry(PoolSpec("p", "", 1.0, ["a:1", "b:1"], policy="cache_aware"))
    prompt = chat(SYSTEM, "q")
    w = reg.pick(prompt=prompt)
    index = reg.pools["p"].placement.index
    w._set_status(NOT_SERVING)
    w._set_status(SERVING)  # restarted: a new epoch, an empty cache
    assert index.match(prompt.blocks(1024), [w]) == [0]
    w2 = reg.pick(prompt=prompt)
    reg.remove_worker("p", w2.address)
    assert index.held(w2.key) == 0


async def test_policies_in_the_pools_file_the_flag_and_the_admin_view() -> None:
    assert parse_pool({"name": "a", "policy": "cache_aware"}).policy == "cache_aware"
    with pytest.raises(PoolConfigError, match="policy"):
        parse_pool({"name": "a", "policy": "fastest"})
    reg = registry(
        PoolSpec("own", "", 1.0, ["a:1"], policy="random"),
        PoolSpec("flag", "", 1.0, ["b:1"]),
        policy="least_load",
    )
    pools = {p["name"]: p for p in reg.describe()["pools"]}  # type: ignore[index]
    assert pools["own"]["policy"] == "random" and pools["flag"]["policy"] == "least_load"
    assert pools["own"]["workers"][0]["load"] == 0


async def test_metrics_name_load_hit_rate_and_decisions() -> None:
    reg = registry(PoolSpec("p", "", 1.0, ["a:1"], policy="cache_aware"))
    reg.workers[0].loaded(pb.WorkerLoad(running=2, prefix_cache_hit_rate=0.5))
    reg.pick(prompt=chat(SYSTEM, "q"))
    text = reg.render_metrics()
    assert 'sluice_edge_worker_load{pool="p",worker="a:1"' in text
    assert "sluice_edge_worker_prefix_cache_hit_ratio{" in text and " 0.5" in text
    assert 'sluice_edge_pool_cache_aware_decisions_total{pool="p",reason="load"} 1' in text
