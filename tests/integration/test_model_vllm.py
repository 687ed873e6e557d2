"""The real engine: one vLLM worker process serving SmolLM2-135M-Instruct, over real gRPC.

One worker for the whole session (`vllm_worker` in conftest.py: engine start is the slow
part, ~35 s on 2 CPU cores), shared with test_model_openai.py; the model directory is made
on first use by scripts/make_model.py (PyPI GGUF -> safetensors).
Run alone with `pytest -m model`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import grpc
import pytest

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from tests.integration.conftest import MAX_MODEL_LEN, MAX_NUM_SEQS
from tests.procs import Proc
from tests.waits import eventually_async

pytestmark = pytest.mark.model

SP = pb.SamplingParams

FRANCE = [("user", "What is the capital of France?")]


@pytest.fixture(scope="module")
def worker(vllm_worker: Proc) -> Proc:
    return vllm_worker


@dataclass
class Result:
    messages: list[pb.GenerateResponse]

    @property
    def final(self) -> pb.Final:
        return self.messages[-1].final

    @property
    def chunks(self) -> list[pb.TokenChunk]:
        return [m.chunk for m in self.messages[:-1]]

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.chunks)

    @property
    def token_ids(self) -> list[int]:
        return [t for c in self.chunks for t in c.token_ids]


def start(
    rid: str = "r1",
    prompt: str | None = None,
    messages: list[tuple[str, str]] | None = None,
    **sampling,
) -> pb.GenerateRequest:
    s = pb.StartGeneration(request_id=rid, sampling=SP(**sampling))
    if messages is not None:
        s.chat.messages.extend(pb.ChatMessage(role=r, content=c) for r, c in messages)
    else:
        s.prompt = prompt or ""
    return pb.GenerateRequest(start=s)


async def generate(stub: pb_grpc.GenerationStub, req: pb.GenerateRequest) -> Result:
    """Simple mode: one start, read until `final`; checks the stream's shape on the way."""
    msgs = [m async for m in stub.Generate(iter([req]), timeout=120)]
    assert [m.index for m in msgs] == list(range(len(msgs)))
    assert msgs and msgs[-1].HasField("final")
    assert not any(m.HasField("final") for m in msgs[:-1])
    return Result(msgs)


@pytest.fixture
async def stub(worker: Proc):
    async with grpc.aio.insecure_channel(worker.address) as ch:
        yield pb_grpc.GenerationStub(ch)


async def test_model_info_reports_the_engine_and_its_context_window(stub):
    models = (await stub.ListModels(pb.ListModelsRequest())).models
    assert [(m.id, m.engine, m.max_model_len) for m in models] == [
        ("SmolLM2-135M-Instruct", "vllm", MAX_MODEL_LEN)
    ]
    stats = await stub.GetStats(pb.GetStatsRequest())
    assert stats.max_running == MAX_NUM_SEQS


async def test_greedy_chat_answer_names_paris(stub):
    res = await generate(stub, start(messages=FRANCE, temperature=0, max_tokens=48))
    assert "Paris" in res.text
    assert res.final.reason == pb.FINISH_REASON_STOP
    tok = await stub.Tokenize(
        pb.TokenizeRequest(
            chat=pb.ChatInput(messages=[pb.ChatMessage(role="user", content=FRANCE[0][1])])
        )
    )
    # The chat template is applied once, by the worker: its system turn is in the count.
    assert res.final.usage.prompt_tokens == tok.count > 30
    assert res.final.usage.completion_tokens == len(res.token_ids) > 0
    # vLLM's engine-core clock (another process) says when prefill began: after arrival,
    # before the first token.
    timing = res.final.timing
    assert 0 < timing.queue_us <= timing.time_to_first_token_us <= timing.total_us


async def test_sixteen_concurrent_streams_finish_with_exact_usage(stub):
    topics = ["rivers", "bees", "stars", "trains", "bread", "snow", "owls", "glass"]
    reqs = [
        start(
            f"c{i}",
            prompt=f"A short note about {topics[i % 8]}:",
            temperature=0.8,
            seed=i,
            max_tokens=40,
        )
        for i in range(16)
    ]
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, (await stub.GetStats(pb.GetStatsRequest())).running)
            await asyncio.sleep(0.05)  # a sampler's pace: it watches, it waits for nothing

    watcher = asyncio.create_task(watch())
    try:
        results = await asyncio.gather(*(generate(stub, r) for r in reqs))
    finally:
        watcher.cancel()
    assert peak >= 2, "the streams never ran together"
    for req, res in zip(reqs, results, strict=True):
        assert res.messages[0].request_id == req.start.request_id
        assert res.final.reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
        assert res.final.usage.completion_tokens == len(res.token_ids) > 0
        assert res.final.usage.completion_tokens <= 40
        tok = await stub.Tokenize(pb.TokenizeRequest(prompt=req.start.prompt))
        assert res.final.usage.prompt_tokens == tok.count


async def _cancel_after_tokens(stub, req: pb.GenerateRequest, tokens: int = 3) -> float:
    """Open the stream, read `tokens` tokens, cancel the RPC; returns when it cancelled
    (just before: the worker cannot see the cancel earlier)."""
    call = stub.Generate(iter([req]))
    received = 0
    async for msg in call:
        received += len(msg.chunk.token_ids)
        if received >= tokens:
            break
    assert (await stub.GetStats(pb.GetStatsRequest())).running == 1
    cancelled_at = time.monotonic()
    call.cancel()
    return cancelled_at


async def _running_drops_to_zero_by(stub, deadline: float) -> None:
    async def stopped() -> bool:
        return (await stub.GetStats(pb.GetStatsRequest())).running == 0

    await eventually_async(
        stopped,
        what="the engine no longer runs the cancelled stream",
        timeout=max(0.0, deadline - time.monotonic()),
        interval=0.02,
    )


def _long(rid: str, **start_fields) -> pb.GenerateRequest:
    req = start(rid, prompt="Count slowly:", temperature=0, max_tokens=900, ignore_eos=True)
    for name, value in start_fields.items():
        setattr(req.start, name, value)
    return req


async def test_cancelled_stream_is_aborted_in_the_engine(stub):
    # detach_grace_ms = 0: no waiting for a Resume, the engine request ends at once.
    cancelled_at = await _cancel_after_tokens(stub, _long("cancel-me", detach_grace_ms=0))
    await _running_drops_to_zero_by(stub, cancelled_at + 1.0)


async def test_detached_stream_is_aborted_in_the_engine_after_its_grace(stub):
    cancelled_at = await _cancel_after_tokens(stub, _long("detach-me", detach_grace_ms=600))
    await _running_drops_to_zero_by(stub, cancelled_at + 0.6 + 1.0)
    assert time.monotonic() - cancelled_at >= 0.6, "aborted before its grace"


async def test_max_tokens_ends_with_length_and_the_exact_count(stub):
    res = await generate(
        stub, start(prompt="Once upon a time", temperature=0, max_tokens=17, ignore_eos=True)
    )
    assert res.final.reason == pb.FINISH_REASON_LENGTH
    assert res.final.usage.completion_tokens == len(res.token_ids) == 17


async def test_stop_string_ends_with_stop_and_is_not_returned(stub):
    free = await generate(stub, start(messages=FRANCE, temperature=0, max_tokens=24))
    words = free.text.split()
    assert len(words) >= 3, free.text
    stop = words[2]  # a word the greedy answer is known to reach
    cut = free.text[: free.text.index(stop)]
    res = await generate(stub, start(messages=FRANCE, temperature=0, max_tokens=24, stop=[stop]))
    assert res.final.reason == pb.FINISH_REASON_STOP
    assert res.final.stop_sequence == stop
    assert stop not in res.text
    assert res.text == cut
    assert res.final.usage.completion_tokens == len(res.token_ids)


async def test_prompt_over_the_context_window_is_invalid_argument(stub):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(stub, start(prompt="hello " * (MAX_MODEL_LEN + 100), max_tokens=4))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "context window" in (info.value.details() or "")


async def test_parameter_vllm_refuses_is_invalid_argument_naming_the_field(stub):
    # Our validation does not compare min_tokens with max_tokens; vLLM does, and says so.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(stub, start(prompt="Hi", min_tokens=10, max_tokens=4))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "sampling.min_tokens" in (info.value.details() or "")
    assert dict(info.value.trailing_metadata())["x-sluice-field"] == "sampling.min_tokens"


async def test_seeded_sampling_repeats_and_another_seed_differs(stub):
    def req(seed: int) -> pb.GenerateRequest:
        return start(messages=FRANCE, temperature=1.0, seed=seed, max_tokens=24, ignore_eos=True)

    a = await generate(stub, req(1234))
    b = await generate(stub, req(1234))
    c = await generate(stub, req(4321))
    assert a.token_ids == b.token_ids and a.text == b.text
    assert c.token_ids != a.token_ids


async def test_logprobs_cover_every_token_with_ranked_alternatives(stub):
    res = await generate(
        stub, start(prompt="The sky is", temperature=0, max_tokens=6, ignore_eos=True, logprobs=3)
    )
    for chunk in res.chunks:
        assert [lp.token_id for lp in chunk.logprobs] == list(chunk.token_ids)
        for lp in chunk.logprobs:
            assert len(lp.top) == 3
            assert [t.logprob for t in lp.top] == sorted((t.logprob for t in lp.top), reverse=True)
            # Greedy: the sampled token is the most likely one.
            assert lp.top[0].token_id == lp.token_id and lp.top[0].logprob == lp.logprob <= 0
            assert lp.text == lp.top[0].text
        assert "".join(lp.text for lp in chunk.logprobs) == chunk.text


async def test_final_assistant_message_is_continued_not_answered_anew(stub):
    """Failover continuations send the text already streamed as an open assistant turn."""
    whole = await generate(stub, start(messages=FRANCE, temperature=0, max_tokens=48))
    words = whole.text.split(" ")
    assert len(words) > 4
    head = " ".join(words[:3])  # e.g. "The capital of"
    req = start(messages=[*FRANCE, ("assistant", head)], temperature=0, max_tokens=48)
    req.start.chat.add_generation_prompt = False
    rest = await generate(stub, req)
    # Greedy: the continuation is the rest of the uninterrupted answer, not a new reply.
    assert (head + rest.text).startswith(whole.text[: len(head) + 10])
    assert "Paris" in rest.text
