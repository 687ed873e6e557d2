"""What kv_aware costs beside the decision itself (`--mode decision` times that): per
request, the edge's `Tokenize` call to a sim worker (its CPU on the calling thread and
the round trip) and hashing a prompt's blocks as vLLM names them; per cache event, the
edge applying a worker's message and the worker building one for each reader.

    python -m scripts.kv_costs [--out scripts/results --name issue27-kv-costs]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path

import grpc

from edge.upstream.cachefeed import CacheFeed
from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from model_service.engines.events import CacheLog, Layout
from model_service.rpc.cache import batch_to_pb
from scripts.bench.workload import WORDS
from sluice_common import blocks
from tests.procs import start_worker

ROOT = blocks.seed_hash(blocks.DEFAULT_SEED)
CALLS = 2000
EVENTS = 20_000


async def tokenize_costs(address: str) -> list[str]:
    rng = random.Random(1)
    lines = []
    async with grpc.aio.insecure_channel(address) as ch:
        stub = pb_grpc.GenerationStub(ch)
        for words in (250, 1500):
            req = pb.TokenizeRequest()
            req.chat.messages.add(role="system", content=" ".join(rng.choices(WORDS, k=words)))
            req.chat.messages.add(role="user", content="hello there")
            for _ in range(100):
                await stub.Tokenize(req)
            walls = []
            cpu0 = time.thread_time()
            for _ in range(CALLS):
                t0 = time.perf_counter()
                ids = list((await stub.Tokenize(req)).token_ids)
                walls.append(time.perf_counter() - t0)
            cpu = (time.thread_time() - cpu0) / CALLS * 1e6
            t0 = time.thread_time()
            for _ in range(200):
                blocks.hashes(ids, 16, ROOT)
            hashing = (time.thread_time() - t0) / 200 * 1e6
            walls.sort()
            lines.append(
                f"| {len(ids):,}-token chat | {cpu:.0f} | {walls[CALLS // 2] * 1e3:.2f} "
                f"| {walls[CALLS * 99 // 100] * 1e3:.2f} | {len(ids) // 16} blocks: {hashing:.0f} |"
            )
    return lines


async def event_costs() -> list[str]:
    rng = random.Random(2)
    feed = CacheFeed("w", None, 262_144)  # type: ignore[arg-type]
    snap = pb.CacheEvents(seq=0, snapshot=True)
    snap.layout.CopyFrom(pb.CacheLayout(block_size=16, hash_algo=blocks.ALGO, hash_seed=ROOT))
    feed.apply(snap)
    msgs = [
        pb.CacheEvents(
            seq=i,
            stored=[rng.getrandbits(64) for _ in range(16)],
            removed=[rng.getrandbits(64) for _ in range(16)],
        ).SerializeToString()
        for i in range(1, EVENTS + 1)
    ]
    t0 = time.thread_time()
    for raw in msgs:
        feed.apply(pb.CacheEvents.FromString(raw))
    edge = (time.thread_time() - t0) / EVENTS * 1e6
    log = CacheLog(Layout(16, blocks.ALGO, ROOT, 100_000))
    readers = [log.reader() for _ in range(4)]
    for r in readers:
        await r.next()
    batches = [[rng.getrandbits(64) for _ in range(16)] for _ in range(EVENTS)]
    t0 = time.thread_time()
    for i, stored in enumerate(batches):
        log.stored(stored)
        for r in readers:
            batch_to_pb(await r.next(), i, log.layout).SerializeToString()
    worker = (time.thread_time() - t0) / EVENTS * 1e6
    return [
        f"| edge: parse and apply a message of 16 stored + 16 removed blocks | {edge:.1f} |",
        f"| worker: 16 blocks stored, a message built and serialized for each of 4 readers "
        f"(its cache full: the oldest trimmed) | {worker:.1f} |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="")
    parser.add_argument("--name", default="issue27-kv-costs")
    args = parser.parse_args()
    worker = start_worker("--engine", "sim")
    try:
        tok = asyncio.run(tokenize_costs(worker.address))
    finally:
        worker.kill()
    ev = asyncio.run(event_costs())
    text = "\n".join([
        "# kv_aware's costs besides the decision",
        "",
        "`python -m scripts.kv_costs`",
        "",
        "| prompt | edge CPU µs per Tokenize | round trip p50 ms | p99 ms | hashing all, µs |",
        "| --- | ---: | ---: | ---: | ---: |",
        *tok,
        "",
        "| per cache event | CPU µs |",
        "| --- | ---: |",
        *ev,
    ]) + "\n"  # fmt: skip
    print(text)
    if args.out:
        Path(args.out, f"{args.name}.md").write_text(text)


if __name__ == "__main__":
    main()
