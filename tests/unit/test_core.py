"""The worker core with the simulated engine, without gRPC: regressions from review."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from generated import sluice_pb2 as pb
from model_service.config import EngineConfig, SimOptions, WorkerConfig
from model_service.core import WorkerCore
from model_service.engines.sim.engine import SimEngine
from model_service.errors import EngineDead, InvalidArgument
from model_service.generation.run import CLIENT_CANCEL, DETACH_EXPIRED


class SlowAbortSim(SimEngine):
    """The sim engine with an abort that takes a while, as vLLM's does (IPC)."""

    aborted: list[str]

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.aborting = asyncio.Event()  # set as an abort begins

    async def abort(self, request_id: str) -> None:
        self.aborting.set()
        await asyncio.sleep(0.05)  # the slowness under test, not a wait for an event
        self.aborted.append(request_id)
        await super().abort(request_id)


async def make_core(engine_cls=SimEngine) -> WorkerCore:
    sim = SimOptions(ttft_s=0, token_delay_s=0.01)
    cfg = WorkerConfig(engine=EngineConfig(engine="sim", sim=sim))
    engine = engine_cls(cfg.engine)
    engine.aborted = []  # type: ignore[attr-defined]
    await engine.start()
    core = WorkerCore(engine, cfg)
    core.ready = True
    return core


def start(rid: str, grace_ms: int | None = None) -> pb.StartGeneration:
    s = pb.StartGeneration(
        request_id=rid, prompt="hello", sampling=pb.SamplingParams(max_tokens=500, ignore_eos=True)
    )
    if grace_ms is not None:
        s.detach_grace_ms = grace_ms
    return s


async def under_way(gen) -> None:  # type: ignore[no-untyped-def]
    """Until the generation has logged its first token: it runs on the engine."""
    while gen.index == 0:
        await asyncio.wait_for(gen.changed(), 5)


async def test_second_cancel_does_not_interrupt_the_engine_abort():
    core = await make_core(SlowAbortSim)
    gen = await core.prepare(start("twice"), None)
    core.launch(gen)
    await under_way(gen)
    gen.cancel(CLIENT_CANCEL)
    await asyncio.wait_for(core.engine.aborting.wait(), 5)  # type: ignore[attr-defined]
    gen.cancel(DETACH_EXPIRED)  # now, inside the slow abort
    assert gen.task is not None
    await gen.task
    final = pb.GenerateResponse.FromString(gen.log[-1]).final  # type: ignore[arg-type]
    assert final.reason == pb.FINISH_REASON_CANCELLED
    assert core.engine.aborted  # type: ignore[attr-defined]
    assert core.engine.stats().running == 0


async def test_generation_never_followed_is_detached_and_aborted():
    core = await make_core()
    gen = await core.prepare(start("orphan", grace_ms=0), None)
    core.launch(gen)
    await under_way(gen)
    assert core.engine.stats().running == 1
    gen.detach_if_unfollowed()  # what a stream does when it ends before following
    assert gen.task is not None
    await asyncio.wait_for(gen.task, 2)
    assert core.engine.stats().running == 0
    assert core.admission.in_flight == 0


async def test_ended_generation_keeps_only_its_log():
    core = await make_core()
    gen = await core.prepare(start("small"), None)
    core.launch(gen)
    gen.cancel(CLIENT_CANCEL)
    assert gen.task is not None
    await gen.task
    assert gen.request.prompt is None and gen.request.prompt_token_ids is None
    assert all(isinstance(e, bytes) for e in gen.log)
    assert core.store.bytes() == gen.log_bytes > 0


async def test_refused_start_is_not_counted_as_finished():
    core = await make_core()
    bad = start("huge")
    bad.prompt = "hello there, friend"
    # Below the context window (validation lets it through), but not with the prompt's
    # four tokens: refused after admission, once the prompt is tokenized.
    bad.sampling.max_tokens = core.engine.model_info.max_model_len - 1
    with pytest.raises(InvalidArgument, match="prompt tokens"):
        await core.prepare(bad, None)
    assert core.admission.in_flight == 0
    assert core.admission.finished_total == 0


async def test_engine_death_turns_the_worker_not_ready():
    core = await make_core()
    called = []
    core.on_engine_dead = lambda: called.append(True)
    core.engine_died(EngineDead("gone"))
    core.engine_died(EngineDead("gone again"))
    assert core.ready is False and called == [True]


async def test_a_prompt_of_no_tokens_is_refused_naming_it():
    """The sim's tokenizer drops whitespace, as some real ones do: vLLM refuses an empty
    prompt, and a generation of none made the sim's cache count -16 cached tokens."""
    core = await make_core()
    blank = start("blank")
    blank.prompt = " \u2028 "
    with pytest.raises(InvalidArgument) as err:
        await core.prepare(blank, None)
    assert (err.value.field, str(err.value)) == (
        "prompt",
        "prompt: the input is no tokens once tokenized",
    )
    assert core.admission.in_flight == 0


class BadFiguresSim(SimEngine):
    """A sim whose outputs carry a count no protobuf field can hold (a worker bug)."""

    async def generate(self, request):  # type: ignore[no-untyped-def,override]
        async for out in super().generate(request):
            out.cached_prompt_tokens = -1
            yield out


async def test_a_worker_bug_while_ending_still_ends_the_log_with_a_final():
    core = await make_core(BadFiguresSim)
    small = start("bug")
    small.sampling.max_tokens = 3
    gen = await core.prepare(small, None)
    core.launch(gen)
    assert gen.task is not None
    await asyncio.wait_for(gen.task, 5)
    last = pb.GenerateResponse.FromString(gen.log[-1])  # type: ignore[arg-type]
    assert gen.ended and last.index == len(gen.log) - 1
    assert last.final.reason == pb.FINISH_REASON_ERROR
    assert (last.final.error.code, last.final.error.message) == (
        grpc.StatusCode.INTERNAL.value[0],
        "the worker failed the generation",
    )


async def test_a_large_start_is_decoded_and_validated_off_the_loop(monkeypatch):
    """Over OFF_LOOP_BYTES a start's decode and checks run in a thread (a 0.4 MB schema's
    took ~12 ms of the loop); a small one inline; a refusal comes back either way."""
    from model_service import core as core_module
    from model_service.intake import decode

    threads = []
    real = decode.request_from_pb

    def recorded(s):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread() is threading.main_thread())
        return real(s)

    monkeypatch.setattr(decode, "request_from_pb", recorded)
    core = await make_core()
    small, large = start("small"), start("large")
    large.prompt = "x" * core_module.OFF_LOOP_BYTES
    for s in (small, large):
        await core.prepare(s, None)
    large.sampling.temperature = -1
    with pytest.raises(InvalidArgument) as info:
        await core.prepare(large, None)
    assert info.value.field == "sampling.temperature"
    assert threads == [True, False, False]
    await core.engine.stop()
