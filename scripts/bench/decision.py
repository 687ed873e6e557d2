"""Decision mode: the time the edge takes to choose a worker, in process.

It builds the edge's own `PoolRegistry` with `--routing-workers` workers (real `Worker`
objects whose channels are never used; statuses and load pushes set by hand), fills a
`cache_aware` pool's prefix index with multi-turn traffic (conversations with shared
system prompts and growing histories, as `conversations.py` makes), then times
`registry.pick(prompt=Prompt(messages))` one call at a time: everything a request pays
between its parsed body and its worker (the prompt's block hashes, the index lookup, the
score, and adding the blocks for the chosen worker). Prompt sizes are the characters of
the whole conversation sent; the other policies are timed alongside for reference.
Between calls the load moves as in a serving edge: each pick holds an in-flight slot on
its worker until `IN_FLIGHT` picks later.

`kv_aware` is timed on token ids (a word each) with every worker's feed live: after each
pick the chosen worker holds the conversation's blocks, as its events would say. Its
figure includes hashing the ids as deep as the walk needs, not the `Tokenize` call.

Figures: `cpu_us`, this thread's CPU time per call over a batch of `--decision-calls` calls, the
best of `REPEATS` batches (as `timeit` reports: what a decision costs when nothing else
competes for the core; the headline and the goal's figure); `cpu_median_us`, the median
batch; and the wall-clock p50 / p99 of single calls over all batches (which a busy
machine inflates by preemption).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import time
import zlib
from collections import deque
from typing import Any

import orjson

from edge.config import RoutingConfig
from edge.routing.pools import PoolSpec
from edge.routing.prefix import Prompt
from edge.routing.registry import PoolRegistry
from edge.upstream.channel import ChannelFactory
from edge.upstream.worker import SERVING, Worker
from generated import sluice_pb2 as pb
from scripts.bench import report
from scripts.bench.config import BenchConfig
from scripts.bench.workload import WORDS
from sluice_common import blocks

POLICIES = ("cache_aware", "kv_aware", "session", "least_load", "random")
BLOCK = 16  # kv_aware's block size (vLLM's on GPUs, the sim's)
GOAL_US = 50.0
GOAL_CHARS = 128_000  # the goal holds for every size measured
GOAL_POLICIES = ("cache_aware", "kv_aware")
CONVERSATIONS = 512
REPEATS = 5
IN_FLIGHT = 64  # generations in flight on the pool while it is timed


def _conversation(rng: random.Random, system: str, chars: int) -> list[tuple[str, str]]:
    messages = [("system", system)]
    size = len(system)
    while size < chars:
        role = "user" if len(messages) % 2 else "assistant"
        text = " ".join(rng.choices(WORDS, k=60))
        messages.append((role, text))
        size += len(text)
    return messages


def _registry(workers: int, policy: str) -> PoolRegistry:
    addresses = [f"10.0.0.{i}:50051" for i in range(workers)]
    spec = PoolSpec("p", "", 1.0, addresses, policy=policy)
    reg = PoolRegistry([spec], RoutingConfig(), ChannelFactory([]), rng=random.Random(1))
    rng = random.Random(2)
    for w in reg.workers:
        w.status, w.epoch = SERVING, 1
        # Other edges' generations on it (a push), besides this edge's own in-flight ones.
        w.loaded(pb.WorkerLoad(running=rng.randrange(8), max_running=64,
                               kv_cache_tokens=500_000))  # fmt: skip
    return reg


def _ids(messages: list[tuple[str, str]]) -> list[int]:
    """A conversation as token ids: a word each (stable across runs)."""
    return [zlib.crc32(w.encode()) & 0xFFFF for _, text in messages for w in text.split()]


def _live(reg: PoolRegistry) -> None:
    """Every worker's cache feed live and empty, as after its first snapshot."""
    seed = blocks.seed_hash(blocks.DEFAULT_SEED)
    for w in reg.workers:
        msg = pb.CacheEvents(seq=0, snapshot=True)
        msg.layout.CopyFrom(pb.CacheLayout(block_size=BLOCK, hash_algo=blocks.ALGO, hash_seed=seed))
        w.cache.apply(msg)


def _tokens(prompts: list[list[tuple[str, str]]]) -> tuple[list[list[int]], list[list[int]]]:
    """Each conversation's ids and block hashes (what its worker's events will report)."""
    ids = [_ids(m) for m in prompts]
    root = blocks.seed_hash(blocks.DEFAULT_SEED)
    return ids, [blocks.hashes(x, BLOCK, root) for x in ids]


def _time(
    reg: PoolRegistry,
    prompts: list[list[tuple[str, str]]],
    calls: int,
    tokens: tuple[list[list[int]], list[list[int]]] | None = None,
) -> tuple[list[float], float]:
    """Wall µs of each call, and CPU µs per call over them all (the picks only);
    `tokens` (kv_aware): each conversation's ids and block hashes."""
    out = []
    clock, cpu = time.perf_counter_ns, time.thread_time_ns
    running: deque[Worker] = deque()
    kv = tokens is not None
    ids, held = tokens if tokens is not None else ([], [])
    cpu_ns = 0
    for i in range(calls):
        k = i % len(prompts)
        prompt = Prompt(prompts[k], token_ids=ids[k] if kv else None)
        c0, t0 = cpu(), clock()
        worker = reg.pick(prompt=prompt)
        out.append((clock() - t0) / 1000)
        cpu_ns += cpu() - c0
        if kv:  # its events: the worker now holds the conversation's blocks
            worker.cache.change(held[k])
        worker.in_flight += 1
        running.append(worker)
        if len(running) > IN_FLIGHT:
            running.popleft().in_flight -= 1
    for w in running:
        w.in_flight -= 1
    return out, cpu_ns / 1000 / calls


def _summary(batches: list[tuple[list[float], float]]) -> dict[str, float]:
    s = sorted(x for wall, _ in batches for x in wall)
    cpu = sorted(c for _, c in batches)
    return {
        "cpu_us": round(cpu[0], 2),
        "cpu_median_us": round(statistics.median(cpu), 2),
        "mean_us": round(statistics.fmean(s), 2),
        "p50_us": round(s[len(s) // 2], 2),
        "p99_us": round(s[int(len(s) * 0.99)], 2),
    }


async def measure(workers: int, calls: int, sizes: tuple[int, ...]) -> dict[str, Any]:
    """Every policy at every prompt size (characters): `REPEATS` batches of `calls`."""
    rng = random.Random(3)
    systems = [" ".join(rng.choices(WORDS, k=200)) for _ in range(8)]
    results: dict[str, Any] = {}
    for size in sizes:
        prompts = [_conversation(rng, systems[i % 8], size) for i in range(CONVERSATIONS)]
        tokens = _tokens(prompts) if "kv_aware" in POLICIES else None
        for policy in POLICIES:
            reg = _registry(workers, policy)
            kv = tokens if policy == "kv_aware" else None
            if kv is not None:
                _live(reg)
            _time(reg, prompts, CONVERSATIONS, kv)  # warm: every conversation seen once
            batches = [_time(reg, prompts, calls, kv) for _ in range(REPEATS)]
            results[f"{policy} {size} chars"] = _summary(batches)
            await reg.close()
    return results


def decision_mode(cfg: BenchConfig) -> dict[str, Any]:
    workers = cfg.routing.workers
    results = asyncio.run(measure(workers, cfg.routing.decision_calls, cfg.routing.decision_sizes))
    upto = min(GOAL_CHARS, max(cfg.routing.decision_sizes))  # the sizes this run measured
    limit = [v["cpu_us"] for k, v in results.items()
             if k.startswith(GOAL_POLICIES) and int(k.split()[1]) <= upto]  # fmt: skip
    doc = {
        "meta": report.meta(),
        "mode": "decision",
        "workers": workers,
        "results": results,
        "goal": {
            f"cache_aware, kv_aware cpu_us <= {GOAL_US:g} up to {upto:,} chars": "met"
            if max(limit) <= GOAL_US
            else "not met"
        },
    }
    lines = [
        f"# Routing decision time, {workers} workers",
        "",
        f"`{doc['meta']['command']}`  ",
        f"{doc['meta']['time_utc']}, commit {doc['meta']['commit']}",
        "",
        "| policy, prompt size | CPU µs/decision (best batch) | median batch | wall p50 µs "
        "| wall p99 µs |",
        "| --- | ---: | ---: | ---: | ---: |",
        *(
            f"| {k} | {v['cpu_us']} | {v['cpu_median_us']} | {v['p50_us']} | {v['p99_us']} |"
            for k, v in results.items()
        ),
        "",
        *(f"{k}: **{v}**" for k, v in doc["goal"].items()),
    ]
    text = "\n".join(lines) + "\n"
    name = cfg.output.name or f"decision-{workers}"
    out = cfg.output.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    (out / f"{name}.md").write_text(text)
    print(text)
    print(f"wrote {out / name}.json, .md", file=sys.stderr)
    doc["runs"] = [{"requests": {"ok": 1}}]
    return doc
