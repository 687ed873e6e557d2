"""The sim engine's prefix cache: block hashes with LRU eviction, hits as cached tokens, and
a TTFT that follows the uncached part of the prompt."""

from __future__ import annotations

import asyncio
import time

from model_service.config import EngineConfig, SimOptions
from model_service.engines.sim.cache import PrefixCache
from model_service.engines.sim.engine import SimEngine
from model_service.types import GenerationRequest, SamplingParams


def test_a_repeated_prompt_hits_its_full_blocks_but_computes_one_token() -> None:
    cache = PrefixCache(block_tokens=4)
    prompt = list(range(10))  # 2 full blocks + 2 tokens
    assert cache.admit(prompt, room_blocks=100) == 0
    assert cache.admit(prompt, room_blocks=100) == 8
    exact = list(range(8))  # all blocks full: the last one is computed again
    assert cache.admit(exact, room_blocks=100) == 4
    assert (cache.queried, cache.hits) == (28, 12)


def test_a_longer_history_hits_its_prefix_and_a_changed_start_hits_nothing() -> None:
    cache = PrefixCache(block_tokens=4)
    turn1 = list(range(12))
    cache.admit(turn1, 100)
    turn2 = [*turn1, 50, 51, 52, 53, 54]
    assert cache.admit(turn2, 100) == 12
    other = [99, *turn1[1:]]  # chained hashes: one token changed up front misses all
    assert cache.admit(other, 100) == 0


def test_least_recently_used_blocks_go_first() -> None:
    cache = PrefixCache(block_tokens=2)
    a, b, c = [1, 2, 3, 4, 0], [5, 6, 7, 8, 0], [9, 10, 11, 12, 0]
    cache.admit(a, room_blocks=4)
    cache.admit(b, room_blocks=4)
    assert cache.admit(a, room_blocks=4) == 4  # a used again: b is now the oldest
    cache.admit(c, room_blocks=4)  # evicts b's blocks
    assert len(cache) == 4
    assert cache.admit(a, room_blocks=4) == 4
    assert cache.admit(b, room_blocks=6) == 0


def test_no_room_keeps_nothing() -> None:
    cache = PrefixCache(block_tokens=2)
    cache.admit([1, 2, 3, 4, 5], room_blocks=0)
    assert len(cache) == 0
    assert cache.admit([1, 2, 3, 4, 5], room_blocks=0) == 0


def _engine(**sim: object) -> SimEngine:
    opts = SimOptions(ttft_s=0, token_delay_s=0, **sim)  # type: ignore[arg-type]
    return SimEngine(EngineConfig(engine="sim", sim=opts))


def _request(rid: str, words: int, start: int = 0) -> GenerationRequest:
    prompt = " ".join(f"w{i}" for i in range(start, start + words))
    return GenerationRequest(rid, SamplingParams(max_tokens=2, temperature=0), prompt=prompt)


async def _first(engine: SimEngine, req: GenerationRequest) -> tuple[float, int]:
    """Seconds to the first output and the request's cached prompt tokens."""
    req.prompt_token_ids = await engine.tokenize(req)
    t0 = time.perf_counter()
    ttft = None
    cached = 0
    async for out in engine.generate(req):
        ttft = ttft if ttft is not None else time.perf_counter() - t0
        cached = out.cached_prompt_tokens
    assert ttft is not None
    return ttft, cached


async def test_the_engine_reports_cached_tokens_and_counts_them_in_its_stats() -> None:
    e = _engine(block_tokens=16)
    await e.start()
    assert (await _first(e, _request("a", 100)))[1] == 0
    assert (await _first(e, _request("b", 100)))[1] == 96
    extra = e.stats().extra
    assert extra["prefix_cache_queries"] == 200 and extra["prefix_cache_hits"] == 96
    assert extra["kv_cache_tokens"] == e.config.sim.kv_cache_tokens


async def test_ttft_follows_uncached_tokens_and_prefills_run_one_at_a_time() -> None:
    e = _engine(block_tokens=16, prefill_tokens_per_s=2000)  # 1,000 tokens: 0.5 s
    await e.start()
    cold, _ = await _first(e, _request("cold", 1000))
    warm, cached = await _first(e, _request("warm", 1000))
    assert cached == 992
    assert cold >= 0.45 and warm < 0.1
    # Two cold prefills at once: the second waits for the first (one lane).
    t = await asyncio.gather(
        _first(e, _request("x", 400, 5000)), _first(e, _request("y", 400, 9000))
    )
    assert sorted(x for x, _ in t)[1] >= 0.35


async def test_the_cache_can_be_turned_off() -> None:
    e = _engine(prefix_cache=False)
    await e.start()
    await _first(e, _request("a", 100))
    assert (await _first(e, _request("b", 100)))[1] == 0
    assert e.stats().extra["prefix_cache_queries"] == 0
