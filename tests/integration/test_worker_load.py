"""`WatchLoad` and the sim's prefix cache, against a real worker process."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from model_service.client import SluiceClient
from tests.procs import start_worker

# Long beside this machine's hiccups (a loop held 0.3 s happens): a push on a change comes
# within half of it. Not the worker's default (1 s): the caller's interval is kept.
HEARTBEAT_MS = 2_000
SYSTEM = " ".join(f"rule{i}" for i in range(300))  # 300+ tokens: many 16-token blocks


@pytest.fixture(scope="module")
def worker():
    w = start_worker(
        "--engine", "sim", "--sim-ttft", "0.01", "--sim-token-delay", "0.01",
        "--sim-prefill-rate", "20000", "--max-num-seqs", "8",
    )  # fmt: skip
    yield w
    w.kill()


async def test_load_is_pushed_at_once_on_change_and_as_a_heartbeat(worker) -> None:
    async with grpc.aio.insecure_channel(worker.address) as ch:
        stub = pb_grpc.GenerationStub(ch)
        request = pb.WatchLoadRequest(min_interval_ms=20, max_interval_ms=HEARTBEAT_MS)
        watch = stub.WatchLoad(request)
        first = await asyncio.wait_for(watch.read(), 2)
        assert (first.seq, first.running, first.max_running) == (0, 0, 8)
        assert first.kv_cache_tokens > 0
        start = pb.StartGeneration(prompt="Tell me about rivers", sampling=pb.SamplingParams(
            max_tokens=60, ignore_eos=True))  # fmt: skip
        gen = stub.Generate(iter([pb.GenerateRequest(start=start)]))
        t0 = time.monotonic()
        msg = await asyncio.wait_for(watch.read(), 2)
        assert msg.running == 1 and msg.seq == 1
        assert time.monotonic() - t0 < HEARTBEAT_MS / 2000  # on the change, not the heartbeat
        async for _ in gen:
            pass
        msg = await asyncio.wait_for(watch.read(), 2)
        while msg.running:  # other figures may have changed meanwhile (KV use)
            msg = await asyncio.wait_for(watch.read(), 2)
        assert msg.generated_tokens >= 60
        t0 = time.monotonic()  # nothing changes now: the next one is the heartbeat
        beat = await asyncio.wait_for(watch.read(), 2 * HEARTBEAT_MS / 1000)
        took = time.monotonic() - t0
        assert 0.75 * HEARTBEAT_MS / 1000 < took < HEARTBEAT_MS / 1000 + 1.0
        assert beat.running == 0
        watch.cancel()


async def test_a_repeated_prefix_is_cached_and_the_hit_rate_is_pushed(worker) -> None:
    history = [("system", SYSTEM), ("user", "What is a river?")]
    async with SluiceClient(worker.address) as client:
        gen = client.generate(messages=history, max_tokens=8, temperature=0)
        answer = "".join([c.text async for c in gen])
        assert gen.final.usage.cached_prompt_tokens == 0
        history += [("assistant", answer), ("user", "And a stream?")]
        gen = client.generate(messages=history, max_tokens=8, temperature=0)
        async for _ in gen:
            pass
        usage = gen.final.usage
        assert usage.cached_prompt_tokens >= 300 and usage.cached_prompt_tokens % 16 == 0
        assert usage.cached_prompt_tokens < usage.prompt_tokens
        load = await anext(client.watch_load(0.02, 1.0))
    assert load.prefix_cache_hit_tokens >= usage.cached_prompt_tokens
    assert 0.2 < load.prefix_cache_hit_rate < 1.0
