"""The worker's `Session` handler on a real gRPC server in this process, over the sim
engine with a tokenizer that waits at a gate for one prompt: a start whose preparation
waits (as vLLM's tokenizing of a long prompt does) holds back no other action, counts
toward the session's limit, ends CANCELLED if cancelled, and an attach to it applies
after it; and vLLM's size rule counts what its template reads, below `may_wait`'s."""

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


async def test_a_start_in_preparation_cancelled_ends_cancelled_and_is_never_run() -> None:
    async with serving() as (engine, call):
        await call.write(
            pb.SessionRequest(
                actions=[pb.SessionAction(cancel=pb.CancelGeneration(request_id="slow"))]
            )
        )
        async with asyncio.timeout(WAIT_S):
            frame = await call.read()
        assert list(frame.accepted) == []
        assert [(m.request_id, m.index, m.final.reason) for m in frame.entries] == [
            ("slow", 0, pb.FINISH_REASON_CANCELLED)
        ]
        assert engine.reached.is_set() and not engine.opened.is_set()
    # `serving` opened the gate and read the session to its end: nothing more for "slow".


async def test_an_attach_to_a_start_in_preparation_applies_after_it_in_order() -> None:
    async with serving() as (engine, call):
        attach = pb.AttachGeneration(request_id="slow", from_index=0)
        await call.write(pb.SessionRequest(actions=[pb.SessionAction(attach=attach)]))
        engine.opened.set()
        seen: list[tuple[str, str, int]] = []  # (kind, request id, tokens or reason)
        async with asyncio.timeout(WAIT_S):
            while not seen or seen[-1][0] != "final":
                frame = await call.read()
                assert frame is not grpc.aio.EOF
                seen.extend(("accepted", r, 0) for r in frame.accepted)
                for m in frame.entries:
                    if m.WhichOneof("kind") == "final":
                        seen.append(("final", m.request_id, m.final.reason))
                    elif seen[-1][0] == "chunk":  # however the tokens were split
                        seen[-1] = ("chunk", m.request_id, seen[-1][2] + len(m.chunk.token_ids))
                    else:
                        seen.append(("chunk", m.request_id, len(m.chunk.token_ids)))
        # Followed once, from index 0, as if the attach had waited for its start: no
        # NOT_FOUND before it, no second acceptance, not cancelled.
        assert seen == [
            ("accepted", "slow", 0),
            ("chunk", "slow", 3),
            ("final", "slow", pb.FINISH_REASON_LENGTH),
        ]


def test_vllm_counts_every_text_its_template_reads_and_may_wait_starts_below_it() -> None:
    """`may_wait` sends a start to a task from MAY_WAIT_BYTES; vLLM tokenizes in its
    thread past INLINE_CHARS of `input_chars`, which counts every text the chat template
    reads (a character is at least one byte on the wire)."""
    from model_service.engines.chat_template import INLINE_CHARS as INLINE_TOKENIZE_CHARS
    from model_service.engines.chat_template import input_chars
    from model_service.types import ChatMessage, SamplingParams, Tool, ToolCall

    assert MAY_WAIT_BYTES <= INLINE_TOKENIZE_CHARS
    big = "x" * (INLINE_TOKENIZE_CHARS + 1)

    def chat(**kw: object) -> GenerationRequest:
        msgs = kw.pop("messages", (ChatMessage("user", "hi"),))
        return GenerationRequest("r", SamplingParams(), messages=msgs, **kw)  # type: ignore[arg-type]

    call = ToolCall(id="c", name="f", arguments=big)
    parts = {
        "prompt": GenerationRequest("r", SamplingParams(), prompt=big),
        "content": chat(messages=(ChatMessage("user", big),)),
        "call arguments": chat(messages=(ChatMessage("assistant", "", tool_calls=(call,)),)),
        "tool description": chat(tools=(Tool("f", description=big),)),
        "tool schema": chat(tools=(Tool("f", parameters={"description": big}),)),
        "documents": chat(documents=({"text": big},)),
        "template variables": chat(template_kwargs={"context": big}),
    }
    assert {k: input_chars(r) > INLINE_TOKENIZE_CHARS for k, r in parts.items()} == dict.fromkeys(
        parts, True
    )
    assert input_chars(chat()) == 2


def test_input_chars_never_exceeds_the_starts_bytes_on_the_wire() -> None:
    """So a start under MAY_WAIT_BYTES (prepared on the session's reader) is never one the
    engine tokenizes in its thread: compact JSON for schemas and template variables (their
    repr is ~1.5x), every other text as sent."""
    from model_service.engines.chat_template import input_chars
    from model_service.intake.decode import request_from_pb

    chat = pb.ChatInput(
        messages=[
            pb.ChatMessage(role="user", content="héllo, wörld " * 50),
            pb.ChatMessage(
                role="assistant",
                tool_calls=[pb.ToolCall(id="c", name="f", arguments='{"a": [1, 2, 3]}')],
            ),
        ],
        tools=[pb.Tool(name="f", description="d" * 300, parameters_json='{"type":"object"}')],
        template_kwargs_json='{"x":[' + ",".join(["0"] * 2800) + '],"y":"ünïcode"}',
        documents=[pb.Document(fields={"title": "t", "text": "z" * 500})],
    )
    start = pb.StartGeneration(request_id="r", chat=chat)
    assert 0 < input_chars(request_from_pb(start)) <= start.ByteSize() < MAY_WAIT_BYTES
