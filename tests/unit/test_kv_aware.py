"""kv_aware in pieces: block names as vLLM's, the worker's cache log and its readers (the
sim's events exact against its cache), the edge's feed of one worker's events, the walk
that finds each worker's held prefix, and the policy through the registry."""

from __future__ import annotations

import asyncio
import random

from edge.config import RoutingConfig
from edge.routing import kvaware
from edge.routing.pools import PoolSpec
from edge.routing.prefix import Prompt
from edge.routing.registry import PoolRegistry
from edge.routing.scores import holder_first
from edge.upstream.cachefeed import CacheFeed, Owners
from edge.upstream.channel import ChannelFactory
from edge.upstream.worker import SERVING, Worker
from generated import sluice_pb2 as pb
from model_service.engines.events import CacheLog, Layout
from model_service.engines.sim.cache import PrefixCache
from model_service.rpc.cache import batch_to_pb
from sluice_common import blocks

ROOT = blocks.seed_hash(blocks.DEFAULT_SEED)


def test_block_names_are_vllms() -> None:
    # vLLM 0.32: init_none_hash(sha256), then hash_block_tokens over blocks of 4 of
    # range(1000, 1040), each hash through maybe_convert_block_hash (its int form).
    vllm = [5160124834463444493, 881344537972422226, 16276992127602420729]
    assert blocks.hashes(list(range(1000, 1040)), 4, ROOT)[:3] == vllm
    assert len(blocks.hashes(list(range(1000, 1043)), 4, ROOT)) == 10  # full blocks only
    assert blocks.hashes(list(range(1000, 1040)), 4, blocks.seed_hash("other"))[0] != vllm[0]


def _log(capacity: int = 0, backlog: int = 1000) -> CacheLog:
    return CacheLog(Layout(4, blocks.ALGO, ROOT, capacity), backlog)


async def _drain(reader, held: set[int]) -> set[int]:  # type: ignore[no-untyped-def]
    """Apply what a reader has pending, as an edge would, through the protobuf message."""
    if not (reader._snapshot or reader._stored or reader._removed):
        return held
    batch = await asyncio.wait_for(reader.next(), 1)
    msg = pb.CacheEvents.FromString(batch_to_pb(batch, 0, reader._log.layout).SerializeToString())
    if msg.snapshot:
        return set(msg.stored)
    return (held - set(msg.removed)) | set(msg.stored)


async def test_the_sims_events_are_exact_against_its_cache() -> None:
    log = _log()
    cache = PrefixCache(4, log)
    reader = log.reader()
    rng = random.Random(5)
    seen: set[int] = set()
    for _ in range(300):  # prompts sharing prefixes, in a cache that evicts as it goes
        prefix = [rng.randrange(3)] * 4 * rng.randrange(4)
        prompt = prefix + [rng.randrange(50) for _ in range(rng.randrange(1, 30))]
        cache.admit(prompt, room_blocks=rng.randrange(5, 40))
        if rng.random() < 0.3:
            seen = await _drain(reader, seen)
            assert seen == set(cache.held()) == set(log.held)
    seen = await _drain(reader, seen)
    assert seen == set(cache.held())
    late = log.reader()  # a reader joining now starts from everything held
    assert await _drain(late, set()) == set(cache.held())


async def test_a_reader_that_falls_behind_gets_a_snapshot() -> None:
    log = _log(backlog=10)
    reader = log.reader()
    assert (await reader.next()).snapshot
    log.stored(list(range(5)))
    batch = await reader.next()
    assert (batch.snapshot, sorted(batch.stored), batch.removed) == (False, [0, 1, 2, 3, 4], [])
    log.stored(list(range(100, 120)))  # past its backlog: everything, once
    log.removed([100])
    batch = await reader.next()
    assert batch.snapshot and set(batch.stored) == set(range(5)) | set(range(101, 120))
    log.reset()  # lost engine events: nothing is known to be held
    assert await reader.next() == type(batch)(True, [], [])
    reader.close()
    assert not log.readers


def test_the_log_is_bounded_by_the_caches_capacity() -> None:
    log = _log(capacity=3)
    log.stored([1, 2, 3, 4, 5])
    assert list(log.held) == [3, 4, 5]
    big: dict[int, None] = dict.fromkeys(range(20))
    assert blocks.trim(big, 16) == list(range(6))  # in bulk: an eighth of the cap more
    assert list(big) == list(range(6, 20)) and blocks.trim(big, 16) == []


def _events(seq: int, snapshot: bool = False, stored=(), removed=(), **layout) -> pb.CacheEvents:  # type: ignore[no-untyped-def]
    msg = pb.CacheEvents(seq=seq, snapshot=snapshot, stored=stored, removed=removed)
    if snapshot:
        lay = {"block_size": 4, "hash_algo": "sha256", "hash_seed": ROOT, "instance": "a"}
        msg.layout.CopyFrom(pb.CacheLayout(**{**lay, **layout}))
    return msg


def test_the_feed_follows_snapshots_and_changes_and_stops_at_a_gap() -> None:
    feed = CacheFeed("w", None, cap=3)  # type: ignore[arg-type]
    assert not feed.apply(_events(0, stored=[1]))  # changes before a snapshot
    feed._next_seq = 0
    assert feed.apply(_events(0, True, stored=[1, 2]))
    assert feed.live and list(feed.held) == [1, 2] and feed.epoch == 1
    assert feed.apply(_events(1, stored=[3, 4], removed=[1]))
    assert list(feed.held) == [2, 3, 4]
    assert feed.apply(_events(2, stored=[5]))  # past its cap: the oldest goes
    assert list(feed.held) == [3, 4, 5]
    assert not feed.apply(_events(4, stored=[6]))  # a gap: the caller reconnects
    feed.reset()
    assert (feed.held, feed.live, feed.resets) == ({}, False, 1)
    assert feed.describe()["blocks"] == 0
    other = CacheFeed("w", None, cap=10)  # type: ignore[arg-type]
    assert other.apply(_events(0, True, stored=[1], hash_algo="xxhash"))
    assert not other.live  # a layout the edge cannot compute: routing ignores it


def test_the_owners_map_is_the_feeds_held_blocks_turned_round() -> None:
    owners, rng = Owners(), random.Random(3)
    owners.SWEEP = 5  # given-back bits cleared a few blocks per message
    feeds = [CacheFeed(f"w{i}", None, cap=12, owners=owners) for i in range(3)]  # type: ignore[arg-type]
    seqs = [0, 0, 0]

    def want() -> dict[int, int]:
        out: dict[int, int] = {}
        for g in feeds:
            for h in g.held:
                out[h] = out.get(h, 0) | g.bit
        return {h: m for h, m in out.items() if m}

    for _ in range(400):
        i = rng.randrange(3)
        f = feeds[i]
        if rng.random() < 0.05:
            f.reset()  # the stream ended: its bit given back
            f._next_seq = seqs[i] = 0
            continue
        snap = rng.random() < 0.1 or f.layout is None or not f.live
        some = [rng.randrange(30) for _ in range(rng.randrange(6))]
        msg = _events(seqs[i], snap, stored=some, removed=[rng.randrange(30) for _ in range(3)])
        assert f.apply(msg)
        seqs[i] += 1
        live = sum(g.bit for g in feeds)
        assert {h: m & live for h, m in owners.masks.items() if m & live} == want()
        assert len({g.bit for g in feeds if g.live}) == sum(g.live for g in feeds)
    assert owners._retiring  # the case this is about happened
    owners.sweep(10**6)
    assert owners.masks == want() and not owners._retiring


def test_the_memo_names_blocks_as_the_chain_does() -> None:
    memo, rng = kvaware.HashMemo(size=20), random.Random(4)
    for _ in range(50):
        ids = [rng.randrange(3) for _ in range(rng.randrange(60))]  # shared prefixes
        assert list(memo.chain(ids, 4, ROOT)) == blocks.hashes(ids, 4, ROOT)
        assert len(memo) <= 20  # emptied when full


def _feed(held: list[int], cap: int = 1000) -> CacheFeed:
    feed = CacheFeed("w", None, cap)  # type: ignore[arg-type]
    feed.apply(_events(0, True, stored=held))
    return feed


def test_the_walk_finds_each_workers_held_prefix() -> None:
    ids = list(range(40))
    hashes = blocks.hashes(ids, 4, ROOT)
    feeds = [_feed(hashes[:7]), _feed(hashes[:3]), _feed([]), _feed(hashes[1:])]
    dead = _feed(hashes)
    dead.reset()
    assert kvaware.held_prefix(ids, [*feeds, dead]) == [7, 3, 0, 0, 0]
    assert kvaware.held_prefix(ids, [dead]) == [0]


def test_the_walk_stops_once_a_lone_holder_wins() -> None:
    ids = list(range(400))
    hashes = blocks.hashes(ids, 4, ROOT)
    feeds = [_feed(hashes), _feed(hashes[:2]), _feed([])]
    # The others' prefixes are final at 2 and 0; one block more and worker 0's is the
    # longest whatever it holds beyond, so the walk ends there (not at block 100).
    assert kvaware.held_prefix(ids, feeds, longest=True) == [3, 2, 0]
    assert kvaware.held_prefix(ids, feeds) == [100, 2, 0]


def test_stopping_early_never_changes_the_pick() -> None:
    rng = random.Random(11)
    stopped = 0
    for _ in range(300):
        ids = [rng.randrange(4) for _ in range(4 * rng.randrange(1, 40))]
        hashes = blocks.hashes(ids, 4, ROOT)
        feeds = [_feed(hashes[: rng.randrange(len(hashes) + 1)]) for _ in range(4)]
        loads = [float(rng.randrange(12)) for _ in feeds]
        free = [rng.random() < 0.8 for _ in feeds]
        slack = float(rng.randrange(10))
        cut = kvaware.held_prefix(ids, feeds, longest=True)
        full = kvaware.held_prefix(ids, feeds)
        assert all(c <= f for c, f in zip(cut, full, strict=True))
        stopped += cut != full
        picks = [holder_first(h, loads, free, slack, random.Random(1)) for h in (cut, full)]
        assert picks[0] == picks[1]
    assert stopped > 30  # the cases this is about happened


def _pick(
    hits: list[int], loads: list[float], slack: float, free: list[bool] | None = None
) -> tuple[int, str]:
    return holder_first(hits, loads, free or [True] * len(hits), slack, random.Random(3))


def test_the_longest_holder_takes_it_within_the_slack() -> None:
    # Worker 0 holds the conversation (10 blocks), the others its system prompt (4).
    assert _pick([10, 4, 4], [12.0, 4.0, 5.0], 8.0) == (0, "cache")  # 8 more: within
    assert _pick([10, 4, 4], [13.0, 4.0, 5.0], 8.0) == (1, "balance")  # 9 more: past
    assert _pick([10, 4, 4], [13.0, 4.0, 5.0], 16.0) == (0, "cache")


def test_past_the_slack_the_least_loaded_with_the_most_held_takes_it() -> None:
    assert _pick([10, 2, 4, 0], [20.0, 3.0, 3.0, 5.0], 4.0) == (2, "balance")


def test_ties_in_prefix_go_to_the_least_loaded_and_no_hit_is_by_load() -> None:
    assert _pick([4, 4, 4], [6.0, 2.0, 3.0], 8.0) == (1, "cache")  # a shared system prompt
    assert _pick([0, 0, 0], [6.0, 2.0, 3.0], 8.0) == (1, "load")


def test_a_holder_without_a_free_slot_is_passed_over() -> None:
    # Saturated worker 0 holds the most: the best holder among those with a slot.
    assert _pick([10, 6, 4], [32.0, 30.0, 4.0], 64.0, [False, True, True]) == (1, "cache")
    assert _pick([10, 0, 0], [32.0, 5.0, 4.0], 64.0, [False, True, True]) == (2, "load")
    # All saturated: the slack alone decides among them all.
    assert _pick([10, 0], [33.0, 32.0], 8.0, [False, False]) == (0, "cache")


def _registry(policy: str = "kv_aware", slack: float = 8.0) -> PoolRegistry:
    spec = PoolSpec("p", "", 1.0, ["a:1", "b:1", "c:1"], policy=policy)
    opts = RoutingConfig(kv_load_slack=slack)
    reg = PoolRegistry([spec], opts, ChannelFactory([]), rng=random.Random(7))
    for w in reg.workers:
        w.status, w.epoch = SERVING, 1
    return reg


def _hold(w: Worker, hashes: list[int]) -> None:
    w.cache._task = asyncio.get_running_loop().create_future()  # type: ignore[assignment]
    w.cache._next_seq = 0
    w.cache.apply(_events(0, True, stored=hashes))


async def test_kv_aware_places_where_the_blocks_are_and_falls_back_without_events() -> None:
    reg = _registry()
    a, b, c = reg.workers
    ids = list(range(100))
    hashes = blocks.hashes(ids, 4, ROOT)
    _hold(a, hashes[:3])
    _hold(b, hashes[:20])
    _hold(c, [])
    b.in_flight = 2
    assert reg.pick(prompt=Prompt(prompt="x", token_ids=ids)) is b
    assert reg.pick(prompt=Prompt(prompt="x", token_ids=list(range(500, 600)))) in (a, c)
    placement = reg.pools["p"].placement
    assert placement.decisions == {"kv_cache": 1, "kv_load": 1}
    for w in reg.workers:  # the events stopped: cache_aware's guesses instead
        w.cache.reset()
    reg.pick(prompt=Prompt(prompt="x", token_ids=ids))
    assert placement.decisions == {"kv_cache": 1, "kv_load": 1, "load": 1}
    assert reg.routes_on_tokens() and not _registry("cache_aware").routes_on_tokens()
    await reg.close()


async def test_the_holder_keeps_a_conversation_within_the_slack_not_past_its_slots() -> None:
    reg = _registry(slack=12.0)
    a, b, c = reg.workers
    ids = list(range(100))
    hashes = blocks.hashes(ids, 4, ROOT)
    _hold(a, hashes[:4])  # the system prompt
    _hold(b, hashes[:20])  # the conversation
    _hold(c, hashes[:4])
    a.in_flight, b.in_flight, c.in_flight = 3, 15, 4
    prompt = Prompt(prompt="x", token_ids=ids)
    assert reg.pick(prompt=prompt) is b  # 12 busier than a: within the slack
    b.in_flight = 16
    assert reg.pick(prompt=prompt) is a  # 13 busier: the least loaded
    b.in_flight = 3
    b.loaded(pb.WorkerLoad(running=8, max_running=8))  # no batch slot left
    assert reg.pick(prompt=prompt) is a
    placement = reg.pools["p"].placement
    assert placement.decisions == {"kv_cache": 2, "kv_balance": 1}
    await reg.close()
