"""A generation on the simulated engine, without gRPC or the worker core: its log of
serialized messages, merging, consumers, detach."""

from __future__ import annotations

import asyncio

from generated import sluice_pb2 as pb
from model_service.config import EngineConfig, SimOptions
from model_service.engines.sim.engine import SimEngine
from model_service.errors import SluiceError
from model_service.generation.run import CLIENT_CANCEL, Generation
from model_service.generation.runtime import Runtime
from model_service.generation.store import ReplayStore
from model_service.types import GenerationRequest, SamplingParams
from sluice_common.histogram import Histogram
from tests.waits import eventually_async


class Hooks:
    """Stands in for the worker core: records what generations report."""

    def __init__(self) -> None:
        self.ended: list[Generation] = []
        self.dead: list[SluiceError] = []
        self.wasted: list[int] = []
        self.store = ReplayStore(retention_s=60, max_bytes=1 << 20)

    def finished(self, gen: Generation) -> None:
        self.ended.append(gen)
        self.store.ended(gen)

    def engine_died(self, err: SluiceError) -> None:
        self.dead.append(err)

    def detach_expired(self, wasted_tokens: int) -> None:
        self.wasted.append(wasted_tokens)


async def make(
    max_tokens: int = 12, delay: float = 0.0, grace: float = 5.0, **sp: object
) -> tuple[Generation, Hooks]:
    engine = SimEngine(EngineConfig(engine="sim", sim=SimOptions(ttft_s=0, token_delay_s=delay)))
    await engine.start()
    hooks = Hooks()
    rt = Runtime(engine, hooks, Histogram((0.01, 0.1)), hooks.store)
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0, **sp)  # type: ignore[arg-type]
    req = GenerationRequest(request_id="g", sampling=sampling, prompt="hello there")
    req.prompt_token_ids = await engine.tokenize(req)
    gen = Generation(rt, req, engine_id="g#1", arrived=0.0, timeout_s=None, detach_grace_s=grace)
    hooks.store.add(gen)
    return gen, hooks


async def follow(gen: Generation, i: int = 0) -> list[bytes]:
    """A consumer as `stream.send_log` is one, minus the wire."""
    got = []
    gen.attach()
    try:
        while True:
            while i < gen.index:
                got.append(gen.take(i))
                i += 1
            if gen.ended:
                return got
            await gen.changed()
    finally:
        gen.release()


def start(gen: Generation) -> asyncio.Task[None]:
    gen.task = asyncio.create_task(gen.run())
    return gen.task


async def test_replay_yields_the_exact_bytes_that_were_sent() -> None:
    gen, hooks = await make(delay=0.002)
    start(gen)
    live = await follow(gen)
    replay = await follow(gen, 0)
    assert replay == live and all(a is b for a, b in zip(replay, live, strict=True))
    msgs = [pb.GenerateResponse.FromString(raw) for raw in live]
    assert [m.index for m in msgs] == list(range(len(msgs)))
    assert msgs[-1].final.usage.completion_tokens == 12
    assert all(isinstance(e, bytes) for e in gen.log) and hooks.ended == [gen]
    assert gen.log_bytes >= sum(len(raw) for raw in live)
    # The store's running totals followed the log as it grew, then moved it to ended.
    assert hooks.store.live_bytes == 0 and hooks.store.bytes() == gen.log_bytes


async def test_tokens_merge_only_into_an_entry_nobody_took() -> None:
    gen, _ = await make(max_tokens=40)
    await start(gen)  # nobody followed: tokens merged into few, large chunks
    msgs = [pb.GenerateResponse.FromString(gen.take(i)) for i in range(gen.index)]
    ids = [t for m in msgs[:-1] for t in m.chunk.token_ids]
    assert len(ids) == 40 and len(msgs) - 1 < 40
    taken, _ = await make(max_tokens=40, delay=0.001)
    start(taken)
    got = await follow(taken)  # a consumer keeping up takes every token as it comes
    assert len(got) - 1 > len(msgs) - 1


async def test_a_consumer_cancelled_while_waiting_leaves_the_others_waiting() -> None:
    """Regression: the consumers shared one future, which the cancelled one cancelled."""
    gen, _ = await make(max_tokens=30, delay=0.005)
    start(gen)
    quitter = asyncio.create_task(follow(gen))
    stayer = asyncio.create_task(follow(gen))
    # Cancelled while both wait for a change (each on its own pending future).
    await eventually_async(
        lambda: len(gen._waiters) == 2, what="both consumers wait for a change", interval=0.001
    )
    quitter.cancel()
    got = await asyncio.wait_for(stayer, 5)
    assert pb.GenerateResponse.FromString(got[-1]).final.usage.completion_tokens == 30


async def test_an_error_is_known_before_its_final_is_logged() -> None:
    gen, _ = await make(max_tokens=500, delay=0.005)
    start(gen)
    await asyncio.wait_for(gen.changed(), 5)  # a first token logged: under way
    gen.cancel(SluiceError("stop here"))
    assert gen.task is not None
    await gen.task
    final = pb.GenerateResponse.FromString(gen.take(gen.index - 1)).final
    assert gen.error is not None and final.reason == pb.FINISH_REASON_ERROR
    assert final.error.message == "stop here"


async def test_detached_generation_reports_its_wasted_tokens() -> None:
    gen, hooks = await make(max_tokens=500, delay=0.01, grace=0.15)  # its text: 46 tokens
    start(gen)
    gen.attach()
    await asyncio.wait_for(gen.changed(), 5)  # a first token logged: under way
    gen.release()  # the last consumer left: the grace starts
    at_release = gen.usage[1]
    assert gen.task is not None
    await asyncio.wait_for(gen.task, 10)
    final = pb.GenerateResponse.FromString(gen.take(gen.index - 1)).final
    assert final.reason == pb.FINISH_REASON_CANCELLED
    # What the grace cost: the tokens made for nobody, counted from the release (how many
    # fit in the grace depends on the machine's load; none, or more than were made, is wrong).
    (wasted,) = hooks.wasted
    assert 1 <= wasted <= gen.usage[1] - at_release, (wasted, at_release, gen.usage)


async def test_client_cancel_ends_with_cancelled() -> None:
    gen, hooks = await make(max_tokens=500, delay=0.002)
    start(gen)
    await asyncio.wait_for(gen.changed(), 5)  # a first token logged: under way
    gen.cancel(CLIENT_CANCEL)
    assert gen.task is not None
    await gen.task
    assert pb.GenerateResponse.FromString(gen.log[-1]).final.reason == (  # type: ignore[arg-type]
        pb.FINISH_REASON_CANCELLED
    )
    assert gen.error is None and hooks.ended == [gen]


class TagReasoner:
    """A `Reasoner` splitting on <think> ... </think> pieces (vLLM's parsers are tested
    through a worker: test_messages_and_reasoning.py)."""

    def __init__(self) -> None:
        self.state = "before"

    def feed(self, text: str, token_ids: list[int]) -> tuple[str, str]:
        if text in ("<think>", "</think>"):
            self.state = "thinking" if text == "<think>" else "answer"
            return "", ""
        return (text, "") if self.state == "thinking" else ("", text)


async def _thinking_run(script: str, delay: float) -> list[pb.TokenChunk]:
    """The chunks of one generation answering `script`, split by `TagReasoner`; unfollowed
    (`delay` 0: everything ready merges) or followed token by token."""
    opts = SimOptions(ttft_s=0, token_delay_s=delay, answer=script)
    engine = SimEngine(EngineConfig(engine="sim", sim=opts))
    await engine.start()
    hooks = Hooks()
    rt = Runtime(engine, hooks, Histogram((0.01, 0.1)), hooks.store)
    req = GenerationRequest(request_id="t", sampling=SamplingParams(max_tokens=40),
                            prompt="rivers?")  # fmt: skip
    req.prompt_token_ids = await engine.tokenize(req)
    gen = Generation(rt, req, engine_id="t#1", arrived=0.0, timeout_s=None, detach_grace_s=1)
    gen.reasoners = [TagReasoner()]
    start(gen)
    if delay:
        raw = await follow(gen)
    else:
        await gen.task  # type: ignore[misc]
        raw = [gen.take(i) for i in range(gen.index)]
    return [pb.GenerateResponse.FromString(m).chunk for m in raw][:-1]


async def test_thinking_is_split_from_the_answer_and_never_merged_after_it() -> None:
    thought, answer = " the river is long ", " Paris is the answer"
    for delay in (0.0, 0.001):
        chunks = await _thinking_run(f"<think>{thought}</think>{answer}", delay)
        # A chunk's thinking comes before its text: read so, the order is the model's.
        assert "".join(c.reasoning + c.text for c in chunks) == thought + answer
        assert "".join(c.reasoning for c in chunks) == thought
        # Unfollowed, thinking and then the answer merge into one chunk; followed, each
        # token is a chunk (the script's 19, less the two delimiters' merged away or not).
        assert len(chunks) == 1 if not delay else len(chunks) >= 17
    # Thinking again after some answer: it starts a chunk of its own, never merged behind
    # the text before it.
    chunks = await _thinking_run("<think> a </think> b <think> c </think> d", 0.0)
    assert [(c.reasoning, c.text) for c in chunks] == [(" a ", " b "), (" c ", " d")]


async def test_stream_usage_sends_the_prompts_count_before_any_token() -> None:
    """`stream_usage` (continuous usage stats): the prompt's message comes first with the
    prompt's count and 0 completion tokens (vLLM's opening chunk); every token chunk
    after it counts the completion so far."""
    gen, _ = await make(max_tokens=3, delay=0.001)
    gen.request.stream_usage = True
    start(gen)
    msgs = [pb.GenerateResponse.FromString(raw) for raw in await follow(gen)]
    prompt = msgs[-1].final.usage.prompt_tokens
    assert prompt > 0
    first = msgs[0].chunk
    assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (prompt, 0)
    assert (first.text, list(first.token_ids)) == ("", [])
    counts = [m.chunk.usage.completion_tokens for m in msgs[1:-1]]
    assert counts == sorted(counts) and counts[-1] == 3 and counts[0] > 0
