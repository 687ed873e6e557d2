"""The worker as internal callers see it: a real process, a real channel, real stubs."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from model_service.client import GenerationError, SluiceClient
from tests.procs import start_worker
from tests.waits import eventually_async

SP = pb.SamplingParams


@pytest.fixture(scope="module")
def worker():
    # 4 slots, room for 4 waiting; tokens every 5 ms; 50-token natural answers.
    w = start_worker(
        "--engine",
        "sim",
        "--max-num-seqs",
        "4",
        "--max-waiting",
        "4",
        "--sim-ttft",
        "0.01",
        "--sim-token-delay",
        "0.005",
        "--sim-answer-tokens",
        "50",
        "--max-model-len",
        "512",
        "--max-prompt-bytes",
        "65536",
    )
    yield w
    w.kill()


def start(rid="r1", prompt="Tell me about rivers", multiplexed=False, **sampling):
    return pb.GenerateRequest(
        start=pb.StartGeneration(
            request_id=rid, prompt=prompt, sampling=SP(**sampling), multiplexed=multiplexed
        )
    )


async def collect(call):
    msgs = [m async for m in call]
    return msgs


async def one(address, req, timeout=None):
    async with grpc.aio.insecure_channel(address) as ch:
        return await collect(pb_grpc.GenerationStub(ch).Generate(iter([req]), timeout=timeout))


async def stats(address) -> pb.WorkerStats:
    async with grpc.aio.insecure_channel(address) as ch:
        return await pb_grpc.GenerationStub(ch).GetStats(pb.GetStatsRequest())


async def test_full_generation_gapless_indices_and_usage(worker):
    msgs = await one(worker.address, start(temperature=0, max_tokens=30))
    assert [m.index for m in msgs] == list(range(len(msgs)))
    assert all(m.request_id == "r1" for m in msgs)
    final = msgs[-1].final
    assert msgs[-1].HasField("final") and not any(m.HasField("final") for m in msgs[:-1])
    assert final.reason == pb.FINISH_REASON_LENGTH
    ids = [t for m in msgs[:-1] for t in m.chunk.token_ids]
    assert final.usage.completion_tokens == len(ids) == 30
    async with grpc.aio.insecure_channel(worker.address) as ch:
        tok = await pb_grpc.GenerationStub(ch).Tokenize(
            pb.TokenizeRequest(prompt="Tell me about rivers")
        )
    assert final.usage.prompt_tokens == tok.count > 0
    assert 0 < final.timing.time_to_first_token_us <= final.timing.total_us


async def test_natural_end_reports_stop(worker):
    msgs = await one(worker.address, start(temperature=0, max_tokens=200))
    assert msgs[-1].final.reason == pb.FINISH_REASON_STOP
    assert 40 <= msgs[-1].final.usage.completion_tokens <= 60


async def test_two_generations_multiplexed_on_one_stream(worker):
    async with grpc.aio.insecure_channel(worker.address) as ch:
        stub = pb_grpc.GenerationStub(ch)
        solo_a = await collect(
            stub.Generate(iter([start("x", "alpha prompt", temperature=0, max_tokens=20)]))
        )
        solo_b = await collect(
            stub.Generate(iter([start("y", "beta prompt", temperature=0, max_tokens=25)]))
        )
        reqs = [
            start("a", "alpha prompt", True, temperature=0, max_tokens=20),
            start("b", "beta prompt", True, temperature=0, max_tokens=25),
        ]
        msgs = await collect(stub.Generate(iter(reqs)))
    by_id: dict[str, list] = {"a": [], "b": []}
    for m in msgs:
        by_id[m.request_id].append(m)
    order = [m.request_id for m in msgs]
    assert order.index("b") < max(i for i, r in enumerate(order) if r == "a"), "not interleaved"
    for rid, solo in (("a", solo_a), ("b", solo_b)):
        got = by_id[rid]
        assert [m.index for m in got] == list(range(len(got)))
        assert "".join(m.chunk.text for m in got) == "".join(m.chunk.text for m in solo)
        assert got[-1].final.reason == pb.FINISH_REASON_LENGTH


async def test_multiplexed_bad_start_fails_in_band_only(worker):
    reqs = [
        start("good", "fine prompt", True, temperature=0, max_tokens=10),
        start("bad", "bad prompt", True, top_p=2.0),
    ]
    async with grpc.aio.insecure_channel(worker.address) as ch:
        call = pb_grpc.GenerationStub(ch).Generate(iter(reqs))
        msgs = await collect(call)
        assert await call.code() == grpc.StatusCode.OK
    bad = [m for m in msgs if m.request_id == "bad"]
    good = [m for m in msgs if m.request_id == "good"]
    assert len(bad) == 1 and bad[0].final.reason == pb.FINISH_REASON_ERROR
    assert bad[0].final.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert bad[0].final.error.field == "sampling.top_p"
    assert good[-1].final.reason == pb.FINISH_REASON_LENGTH


async def test_cancel_message_mid_stream_frees_engine_slot(worker):
    async with grpc.aio.insecure_channel(worker.address) as ch:
        stub = pb_grpc.GenerationStub(ch)
        outbox: asyncio.Queue = asyncio.Queue()
        await outbox.put(start("c", max_tokens=400, ignore_eos=True))

        async def reqs():
            while (m := await outbox.get()) is not None:
                yield m

        call = stub.Generate(reqs())
        got = []
        async for m in call:
            got.append(m)
            if len(got) == 3:
                assert (await stub.GetStats(pb.GetStatsRequest())).running == 1
                await outbox.put(pb.GenerateRequest(cancel=pb.CancelGeneration(request_id="c")))
            if m.HasField("final"):
                break
        await outbox.put(None)
        assert got[-1].final.reason == pb.FINISH_REASON_CANCELLED
        assert got[-1].final.usage.completion_tokens < 400
        assert [m.index for m in got] == list(range(len(got)))
        assert (await stub.GetStats(pb.GetStatsRequest())).running == 0


async def test_rpc_cancel_aborts_engine_request(worker):
    async with grpc.aio.insecure_channel(worker.address) as ch:
        stub = pb_grpc.GenerationStub(ch)
        req = start("k", max_tokens=400, ignore_eos=True)
        req.start.detach_grace_ms = 0  # no resume wanted: abort as soon as the RPC ends
        call = stub.Generate(iter([req]))
        n = 0
        async for _ in call:
            n += 1
            if n == 3:
                break
        assert (await stub.GetStats(pb.GetStatsRequest())).running == 1
        call.cancel()
        await eventually_async(
            lambda: not_running(stub), what="the cancelled request is aborted", timeout=1
        )


async def test_deadline_exceeded_aborts_engine_request(worker):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await one(worker.address, start(max_tokens=400, ignore_eos=True), timeout=0.3)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The start message's own timeout: the worker reports it.
    req = start(max_tokens=400, ignore_eos=True)
    req.start.timeout_ms = 200
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await one(worker.address, req)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "deadline" in e.value.details()
    async with grpc.aio.insecure_channel(worker.address) as ch:
        stub = pb_grpc.GenerationStub(ch)
        await eventually_async(lambda: not_running(stub), what="the expired request is aborted")


async def not_running(stub) -> bool:  # type: ignore[no-untyped-def]
    return (await stub.GetStats(pb.GetStatsRequest())).running == 0


def _bad(**kw):
    kw.setdefault("sampling", SP(max_tokens=5))
    return pb.GenerateRequest(start=pb.StartGeneration(request_id="bad", **kw))


@pytest.mark.parametrize(
    ("req", "field"),
    [
        (_bad(prompt=""), "prompt"),
        (_bad(), "input"),
        (_bad(prompt="hi", sampling=SP(max_tokens=0)), "sampling.max_tokens"),
        (_bad(prompt="hi", sampling=SP(max_tokens=100000)), "sampling.max_tokens"),
        (_bad(prompt="hi", sampling=SP(temperature=float("nan"))), "sampling.temperature"),
        (_bad(prompt="hi", sampling=SP(temperature=-1)), "sampling.temperature"),
        (_bad(prompt="hi", sampling=SP(top_p=0)), "sampling.top_p"),
        (_bad(prompt="hi", sampling=SP(top_p=1.01)), "sampling.top_p"),
        (_bad(prompt="hi", sampling=SP(stop=["x"] * 17)), "sampling.stop"),
        (_bad(prompt="hi", sampling=SP(stop=["ok", ""])), "sampling.stop[1]"),
        (_bad(prompt="x " * 40000), "prompt"),  # over --max-prompt-bytes
        (_bad(prompt="word " * 600), "prompt"),  # over the 512-token context window
        (
            _bad(chat=pb.ChatInput(messages=[pb.ChatMessage(role="robot", content="x")])),
            "chat.messages[0].role",
        ),
        (_bad(chat=pb.ChatInput()), "chat.messages"),
        (_bad(prompt_tokens=pb.TokenPrompt()), "prompt_tokens"),
        (_bad(prompt_tokens=pb.TokenPrompt(ids=[1, 10**6])), "prompt_tokens"),  # vocabulary
        (_bad(prompt_tokens=pb.TokenPrompt(ids=[1] * 600)), "prompt_tokens"),  # context
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
async def test_invalid_input_gets_invalid_argument_naming_field(worker, req, field):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await one(worker.address, req)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in e.value.details()
    assert dict(e.value.trailing_metadata())["x-sluice-field"] == field


async def test_unknown_model_is_not_found(worker):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await one(worker.address, _bad(prompt="hi", model="no-such-model"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


async def test_bad_request_does_not_disturb_other_streams(worker):
    async with SluiceClient(worker.address) as client:
        good = client.generate(prompt="steady stream", temperature=0, max_tokens=40)
        task = asyncio.create_task(good.text())
        for _ in range(5):
            with pytest.raises(GenerationError):
                await client.generate(prompt="hi", top_p=5.0).text()
        text = await task
    assert good.final is not None and good.final.usage.completion_tokens == 40
    assert len(text.split()) == 40


async def test_python_client_round_trip(worker):
    async with SluiceClient(worker.address) as client:
        models = await client.list_models()
        assert models[0].engine == "sim" and models[0].max_model_len == 512
        gen = client.generate(messages=[("user", "hello")], temperature=0, max_tokens=12)
        text = await gen.text()
        assert gen.final.usage.completion_tokens == 12 and len(text.split()) == 12
        with pytest.raises(GenerationError) as e:
            await client.generate(
                prompt="slow", max_tokens=400, ignore_eos=True, timeout=0.2
            ).text()
        assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_overload_refused_fast_with_retry_hint_while_admitted_complete():
    w = start_worker(
        "--engine",
        "sim",
        "--max-num-seqs",
        "2",
        "--max-waiting",
        "2",
        "--sim-ttft",
        "0",
        "--sim-token-delay",
        "0.01",
    )
    try:
        async with SluiceClient(w.address) as client:
            # Warm the drain-rate estimate with a few finished generations.
            await asyncio.gather(
                *(client.generate(prompt="warm", max_tokens=3).text() for _ in range(4))
            )
            admitted = [
                client.generate(prompt=f"p{i}", max_tokens=30, ignore_eos=True) for i in range(4)
            ]
            tasks = [asyncio.create_task(g.text()) for g in admitted]
            await eventually_async(  # 2 running, 2 queued: the worker is full
                lambda: full(client), what="the four admitted requests hold every place"
            )
            t0 = time.monotonic()
            with pytest.raises(GenerationError) as e:
                await client.generate(prompt="one too many", max_tokens=5).text()
            assert time.monotonic() - t0 < 0.5  # refused fast, not queued
            assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert 0 < e.value.retry_after_s <= 30
            await asyncio.gather(*tasks)
            assert all(g.final.usage.completion_tokens == 30 for g in admitted)
            assert (await client.stats()).rejected_total == 1
    finally:
        w.kill()


async def full(client: SluiceClient) -> bool:
    s = await client.stats()
    return s.running + s.waiting == 4


async def test_health_across_start_and_sigterm_drain_in_flight_completes():
    w = start_worker(
        "--engine",
        "sim",
        "--sim-startup",
        "1.5",
        "--sim-token-delay",
        "0.02",
        "--drain-grace",
        "10",
        wait=False,
    )
    seen: list[int] = []
    try:
        async with grpc.aio.insecure_channel(w.address) as ch:
            watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""))
            it = watch.__aiter__()
            seen.append((await it.__anext__()).status)
            assert seen == [health_pb2.HealthCheckResponse.NOT_SERVING]
            # Refused while loading.
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await collect(pb_grpc.GenerationStub(ch).Generate(iter([start(max_tokens=3)])))
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            seen.append((await asyncio.wait_for(it.__anext__(), 10)).status)
            assert seen[-1] == health_pb2.HealthCheckResponse.SERVING

            stub = pb_grpc.GenerationStub(ch)
            call = stub.Generate(iter([start("drained", max_tokens=50, ignore_eos=True)]))
            first = await call.__aiter__().__anext__()
            w.proc.terminate()  # SIGTERM mid-stream
            seen.append((await asyncio.wait_for(it.__anext__(), 5)).status)
            assert seen[-1] == health_pb2.HealthCheckResponse.NOT_SERVING
            # New work is refused while draining...
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await collect(stub.Generate(iter([start("late", max_tokens=3)])))
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            # ...while the in-flight stream runs to its end.
            rest = [m async for m in call]
            assert [first.index] + [m.index for m in rest] == list(range(len(rest) + 1))
            assert rest[-1].final.usage.completion_tokens == 50
        assert w.proc.wait(15) == 0
    finally:
        w.kill()


async def test_drain_grace_over_ends_streams_with_unavailable():
    w = start_worker("--engine", "sim", "--sim-token-delay", "0.02", "--drain-grace", "0.5")
    try:
        async with grpc.aio.insecure_channel(w.address) as ch:
            call = pb_grpc.GenerationStub(ch).Generate(
                iter([start(max_tokens=1000, ignore_eos=True)])
            )
            await call.__aiter__().__anext__()
            w.proc.terminate()
            with pytest.raises(grpc.aio.AioRpcError) as e:
                async for _ in call:
                    pass
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert w.proc.wait(15) == 0
    finally:
        w.kill()


async def _read_some(stub, req, n):
    """Open a Generate stream, read `n` messages, then drop the RPC."""
    call = stub.Generate(iter([req]))
    got = []
    async for m in call:
        got.append(m)
        if len(got) == n:
            break
    call.cancel()
    return got


async def _resume(stub, rid, from_index):
    return [m async for m in stub.Resume(pb.ResumeRequest(request_id=rid, from_index=from_index))]


@pytest.mark.parametrize("cut_after", [1, 5, 20])
async def test_dropped_stream_resumes_from_exact_index(worker, cut_after):
    async with grpc.aio.insecure_channel(worker.address) as ch:
        stub = pb_grpc.GenerationStub(ch)
        whole = await collect(
            stub.Generate(iter([start("whole", "resume me", temperature=0, max_tokens=30)]))
        )
        rid = f"cut-{cut_after}"
        head = await _read_some(
            stub, start(rid, "resume me", temperature=0, max_tokens=30), cut_after
        )
        tail = await _resume(stub, rid, len(head))
    got = head + tail
    assert [m.index for m in got] == list(range(len(got)))
    assert "".join(m.chunk.text for m in got) == "".join(m.chunk.text for m in whole)
    assert got[-1].final.usage.completion_tokens == 30


async def test_resume_after_end_replays_tail_and_unknown_or_future_index_refused(worker):
    async with grpc.aio.insecure_channel(worker.address) as ch:
        stub = pb_grpc.GenerationStub(ch)
        full = await collect(stub.Generate(iter([start("done-1", temperature=0, max_tokens=10)])))
        tail = await _resume(stub, "done-1", 7)
        assert tail == full[7:]
        assert await _resume(stub, "done-1", len(full)) == []
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await _resume(stub, "done-1", len(full) + 1)
        assert e.value.code() == grpc.StatusCode.OUT_OF_RANGE
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await _resume(stub, "never-started", 0)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


async def test_live_request_id_conflict_is_refused(worker):
    async with grpc.aio.insecure_channel(worker.address) as ch:
        stub = pb_grpc.GenerationStub(ch)
        call = stub.Generate(iter([start("twin", max_tokens=200, ignore_eos=True)]))
        await call.__aiter__().__anext__()
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await collect(stub.Generate(iter([start("twin", max_tokens=5)])))
        assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
        call.cancel()


async def test_detached_generation_aborts_after_grace_and_counts_waste():
    w = start_worker(
        "--engine",
        "sim",
        "--sim-token-delay",
        "0.01",
        "--default-detach-grace",
        "0.3",
        "--replay-retention",
        "0.5",
    )
    try:
        async with grpc.aio.insecure_channel(w.address) as ch:
            stub = pb_grpc.GenerationStub(ch)
            t0 = time.monotonic()  # before the drop: its grace (0.3 s) starts after it
            await _read_some(stub, start("gone", max_tokens=1000, ignore_eos=True), 2)
            s = await stub.GetStats(pb.GetStatsRequest())
            assert s.running == 1, "still generating during the grace period"

            async def expired() -> pb.WorkerStats | None:
                s = await stub.GetStats(pb.GetStatsRequest())
                return s if s.detach_expired_total == 1 and s.running == 0 else None

            s = await eventually_async(expired, what="the detached generation's grace ran out")
            assert time.monotonic() - t0 >= 0.3, "aborted before its grace"
            assert s.wasted_tokens_total > 5  # it ran on meanwhile
            tail = await _resume(stub, "gone", 0)  # the log is kept for retention after the end
            assert tail[-1].final.reason == pb.FINISH_REASON_CANCELLED

            async def forgotten() -> bool:
                return (await stub.GetStats(pb.GetStatsRequest())).replay_generations == 0

            await eventually_async(forgotten, what="the log expired (0.5 s retention)")
            with pytest.raises(grpc.aio.AioRpcError) as e:  # retention over
                await _resume(stub, "gone", 0)
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
            assert (await stub.GetStats(pb.GetStatsRequest())).replay_generations == 0
    finally:
        w.kill()


async def test_accepted_metadata_then_drop_then_resume_whole_generation(worker):
    """Start, wait only for acceptance, drop the RPC; Resume from 0 gets everything."""
    async with grpc.aio.insecure_channel(worker.address) as ch:
        stub = pb_grpc.GenerationStub(ch)
        whole = await collect(
            stub.Generate(iter([start("w2", "handoff", temperature=0, max_tokens=20)]))
        )
        call = stub.Generate(iter([start("handoff-1", "handoff", temperature=0, max_tokens=20)]))
        md = await call.initial_metadata()
        assert dict(md)["x-sluice-request-id"] == "handoff-1"
        call.cancel()
        got = await _resume(stub, "handoff-1", 0)
        assert [m.index for m in got] == list(range(len(got)))
        assert "".join(m.chunk.text for m in got) == "".join(m.chunk.text for m in whole)
        # A refused start sends no acceptance: the status comes instead.
        bad = stub.Generate(iter([start("handoff-2", top_p=9.0)]))
        with pytest.raises(grpc.aio.AioRpcError):
            await collect(bad)
        assert "x-sluice-request-id" not in dict(await bad.initial_metadata())


def raw_stubs(ch: grpc.aio.Channel):
    """Generate and Resume without response parsing: the bytes the worker sent."""
    generate = ch.stream_stream(
        "/sluice.v1.Generation/Generate",
        request_serializer=pb.GenerateRequest.SerializeToString,
        response_deserializer=None,
    )
    resume = ch.unary_stream(
        "/sluice.v1.Generation/Resume",
        request_serializer=pb.ResumeRequest.SerializeToString,
        response_deserializer=None,
    )
    return generate, resume


async def test_a_resumed_stream_is_the_original_byte_for_byte(worker):
    """Each message is serialized once into the replay log; replays send those bytes."""
    async with grpc.aio.insecure_channel(worker.address) as ch:
        generate, resume = raw_stubs(ch)
        req = start("bytes-1", "byte for byte", temperature=0, max_tokens=25)
        req.start.stamp_times = True  # a replay carries the original send times too
        sent = [raw async for raw in generate(iter([req]))]
        again = [raw async for raw in resume(pb.ResumeRequest(request_id="bytes-1"))]
        tail = [raw async for raw in resume(pb.ResumeRequest(request_id="bytes-1", from_index=9))]
        reqs = [
            start("mux-a", "alpha", True, temperature=0, max_tokens=15),
            start("mux-b", "beta", True, temperature=0, max_tokens=20),
        ]
        mixed = [pb.GenerateResponse.FromString(raw) async for raw in generate(iter(reqs))]
        replays = {
            rid: [raw async for raw in resume(pb.ResumeRequest(request_id=rid))]
            for rid in ("mux-a", "mux-b")
        }
    assert again == sent and tail == sent[9:]
    msgs = [pb.GenerateResponse.FromString(raw) for raw in sent]
    assert msgs[-1].final.usage.completion_tokens == 25 and all(m.worker_time_ns for m in msgs)
    for rid, replay in replays.items():
        assert replay == [m.SerializeToString() for m in mixed if m.request_id == rid]


async def test_python_client_session_form_matches_simple_mode(worker):
    """Five generations on one `Session` through the client (a 512-byte window: acked as
    read) give exactly what five simple-mode RPCs give; a refusal, a deadline and a cancel
    beside them come back as in simple mode, and the others finish untouched (the test
    worker takes eight at once)."""
    kinds = [
        dict(prompt=f"p{i}", temperature=0, max_tokens=60 + i, ignore_eos=True) for i in range(5)
    ]
    async with SluiceClient(worker.address) as client:
        want = [await client.generate(request_id=f"s{i}", **k).text() for i, k in enumerate(kinds)]
        async with client.session(window_bytes=512) as session:
            gens = [session.generate(request_id=f"x{i}", **k) for i, k in enumerate(kinds)]
            with pytest.raises(GenerationError) as bad:
                await session.generate(prompt="hi", top_p=5.0).text()
            assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(GenerationError) as late:
                await session.generate(
                    prompt="slow", max_tokens=400, ignore_eos=True, timeout=0.2
                ).text()
            assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
            stopped = session.generate(prompt="stop", max_tokens=400, ignore_eos=True)
            async for _ in stopped:  # the first chunk, then cancel once
                if stopped.last_index == 0:
                    stopped.cancel()
            got = await asyncio.gather(*(g.text() for g in gens))
    assert got == want
    assert [g.final.usage.completion_tokens for g in gens] == [60 + i for i in range(5)]
    assert stopped.final is not None and stopped.final.reason == pb.FINISH_REASON_CANCELLED


async def test_a_prompt_as_token_ids_is_the_same_generation_as_its_text(worker):
    """`prompt_tokens` skips the tokenizer: the ids of a text prompt give that prompt's
    generation, message for message."""
    async with SluiceClient(worker.address) as client:
        ids = await client.tokenize(prompt="rivers run to the sea")
    text = start("t", prompt="rivers run to the sea", max_tokens=20, temperature=0)
    by_text = await one(worker.address, text)
    by_ids = pb.StartGeneration(request_id="t", sampling=text.start.sampling)
    by_ids.prompt_tokens.ids.extend(ids)
    got = await one(worker.address, pb.GenerateRequest(start=by_ids))
    strip = lambda msgs: [m for m in msgs if not m.HasField("final")]  # noqa: E731
    assert strip(got) == strip(by_text) and got[-1].final.usage == by_text[-1].final.usage
