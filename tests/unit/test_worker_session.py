"""The worker's `Session` handler on a real gRPC server in this process, over the sim
engine with a tokenizer that waits at a gate for one prompt: a start whose preparation
waits (as vLLM's tokenizing of a long prompt in its pool does) holds back none of the
session's other actions, and counts toward the session's limit meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import grpc

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from model_service.config import EngineConfig, SimOptions, WorkerConfig
from model_service.core import MAY_WAIT_BYTES, WorkerCore
from model_service.engines.sim.engine import SimEngine
from model_service.rpc.servicer import GenerationServicer, add_to_server
from model_service.types import GenerationRequest

WAIT_S = 5.0
SLOW = "slow " * (MAY_WAIT_BYTES // 5 + 1)  # over MAY_WAIT_BYTES: may wait, in a task


class GatedTokenizer(SimEngine):
    """The sim engine; tokenizing the prompt `SLOW` waits until `opened` is set."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.reached = asyncio.Event()
        self.opened = asyncio.Event()

    async def tokenize(self, request: GenerationRequest) -> list[int]:
        if request.prompt == SLOW:
            self.reached.set()
            await self.opened.wait()
        return await super().tokenize(request)


def start(rid: str, prompt: str) -> pb.SessionAction:
    sampling = pb.SamplingParams(max_tokens=3, ignore_eos=True, temperature=0)
    return pb.SessionAction(
        start=pb.StartGeneration(request_id=rid, prompt=prompt, sampling=sampling)
    )


@asynccontextmanager
async def serving(**limits: int) -> AsyncIterator[tuple[GatedTokenizer, grpc.aio.StreamStreamCall]]:
    """A worker over `GatedTokenizer` on 127.0.0.1 and one `Session` call to it."""
    sim = SimOptions(ttft_s=0, token_delay_s=0)
    cfg = WorkerConfig(engine=EngineConfig(engine="sim", sim=sim))
    cfg = replace(cfg, limits=replace(cfg.limits, **limits))
    engine = GatedTokenizer(cfg.engine)
    await engine.start()
    core = WorkerCore(engine, cfg)
    core.ready = True
    server = grpc.aio.server()
    add_to_server(GenerationServicer(core), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = pb_grpc.GenerationStub(ch).Session()
            await call.write(pb.SessionRequest(actions=[start("slow", SLOW)]))
            async with asyncio.timeout(WAIT_S):
                await engine.reached.wait()
            yield engine, call
            engine.opened.set()
            await call.done_writing()
            async with asyncio.timeout(WAIT_S):
                while await call.read() is not grpc.aio.EOF:  # nothing live: the session ends
                    pass
                assert await call.code() == grpc.StatusCode.OK
    finally:
        await server.stop(None)
        await engine.stop()


async def test_a_start_waiting_in_preparation_holds_back_no_other_action() -> None:
    async with serving() as (engine, call):
        # The slow start waits in its tokenizer; the next start, on the same session, is
        # accepted and runs to its end meanwhile.
        await call.write(pb.SessionRequest(actions=[start("fast", "hello there")]))
        seen: list[tuple[str, str, int]] = []  # (kind, request id, tokens)

        async def read_until_final(rid: str) -> None:
            async with asyncio.timeout(WAIT_S):
                while ("final", rid, 0) not in seen:
                    frame = await call.read()
                    assert frame is not grpc.aio.EOF
                    seen.extend(("accepted", r, 0) for r in frame.accepted)
                    for m in frame.entries:
                        kind, n = m.WhichOneof("kind"), len(m.chunk.token_ids)
                        if seen and seen[-1][:2] == (kind, m.request_id) == ("chunk", m.request_id):
                            n += seen.pop()[2]  # however the tokens were split
                        seen.append((kind, m.request_id, n))

        await read_until_final("fast")
        assert seen == [("accepted", "fast", 0), ("chunk", "fast", 3), ("final", "fast", 0)]
        engine.opened.set()
        await read_until_final("slow")
        assert seen[3:] == [("accepted", "slow", 0), ("chunk", "slow", 3), ("final", "slow", 0)]


async def test_a_start_in_preparation_counts_toward_the_session_limit() -> None:
    async with serving(max_generations_per_session=1) as (_engine, call):
        await call.write(pb.SessionRequest(actions=[start("second", "hello there")]))
        async with asyncio.timeout(WAIT_S):
            frame = await call.read()
        assert [
            (m.request_id, m.final.error.code, m.final.error.message) for m in frame.entries
        ] == [("second", 9, "too many live generations on this session")]
        assert list(frame.accepted) == []
