"""The simulated engine behaves like a continuous-batching engine."""

import asyncio
import os

import pytest

from model_service.config import EngineConfig, SimOptions
from model_service.engines.sim.engine import SimEngine
from model_service.types import FinishReason, GenerationRequest, SamplingParams
from tests.waits import eventually_async


def engine(**kw) -> SimEngine:
    sim = SimOptions(
        ttft_s=0,
        token_delay_s=kw.pop("delay", 0),
        answer_tokens=kw.pop("answer", 48),
        step=kw.pop("step", "batch"),
    )
    return SimEngine(EngineConfig(engine="sim", sim=sim, **kw))


def req(rid="r", prompt="hello world", **sp) -> GenerationRequest:
    return GenerationRequest(request_id=rid, prompt=prompt, sampling=SamplingParams(**sp))


async def run(e: SimEngine, r: GenerationRequest):
    outs = [o async for o in e.generate(r)]
    return "".join(o.text for o in outs), [t for o in outs for t in o.token_ids], outs[-1]


async def test_greedy_is_deterministic_and_prompt_dependent():
    e = engine()
    await e.start()
    a = await run(e, req(temperature=0, max_tokens=20))
    b = await run(e, req(temperature=0, max_tokens=20))
    c = await run(e, req(prompt="something else", temperature=0, max_tokens=20))
    assert a[0] == b[0] and a[1] == b[1]
    assert a[0] != c[0]
    assert a[2].finish_reason is FinishReason.LENGTH and a[2].completion_tokens == 20 == len(a[1])


async def test_seed_reproducible_and_distinct():
    e = engine()
    await e.start()
    a = await run(e, req(temperature=1.0, seed=1, max_tokens=16))
    b = await run(e, req(temperature=1.0, seed=1, max_tokens=16))
    c = await run(e, req(temperature=1.0, seed=2, max_tokens=16))
    assert a[0] == b[0] and a[0] != c[0]


async def test_natural_stop_when_answer_ends():
    e = engine(answer=5)
    await e.start()
    _, ids, last = await run(e, req(temperature=0, max_tokens=100))
    assert last.finish_reason is FinishReason.STOP
    assert last.completion_tokens == len(ids) <= 9


async def test_stop_string_truncates_and_is_not_emitted():
    e = engine()
    await e.start()
    full, _, _ = await run(e, req(temperature=0, max_tokens=40))
    words = full.split()
    stop = f" {words[5]} {words[6]}"  # spans two tokens
    text, _, last = await run(e, req(temperature=0, max_tokens=40, stop=(stop,)))
    assert last.finish_reason is FinishReason.STOP and last.stop_sequence == stop
    assert stop not in text
    assert text == full[: full.index(stop)]


async def test_slots_queue_and_abort_frees_slot_at_once():
    e = engine(max_num_seqs=1, delay=0.01)
    await e.start()
    first = e.generate(req("a", max_tokens=1000, ignore_eos=True))
    await first.__anext__()
    second = asyncio.create_task(run(e, req("b", max_tokens=3)))
    await eventually_async(lambda: e.stats().waiting == 1, what="b waits for the one slot")
    assert (e.stats().running, e.stats().waiting) == (1, 1)
    await e.abort("a")
    assert e.stats().running == 1 and e.stats().waiting == 0  # b took the freed slot
    _, ids, _ = await asyncio.wait_for(second, 2)
    assert len(ids) == 3
    await first.aclose()
    assert (e.stats().running, e.stats().waiting, e.stats().kv_cache_usage) == (0, 0, 0)


async def test_closing_the_generator_releases_slot():
    e = engine(max_num_seqs=2, delay=0.01)
    await e.start()
    g = e.generate(req("a", max_tokens=100))
    await g.__anext__()
    assert e.stats().running == 1
    await g.aclose()
    assert e.stats().running == 0


async def test_duplicate_live_request_id_refused():
    e = engine(delay=0.01)
    await e.start()
    g = e.generate(req("a", max_tokens=100))
    await g.__anext__()
    with pytest.raises(ValueError):
        await e.generate(req("a")).__anext__()
    await g.aclose()


async def test_faults_from_the_fault_file_change_while_running(tmp_path):
    """Every 1/error_rate-th generation fails after `error_after_tokens` tokens; the file
    is re-read when it changes, so faults come and go without a restart."""
    from model_service.errors import EngineError

    path = tmp_path / "faults.json"
    sim = SimOptions(ttft_s=0, token_delay_s=0, fault_file=str(path))
    e = SimEngine(EngineConfig(engine="sim", sim=sim))
    await e.start()

    async def outcome(i: int) -> tuple[str, int]:
        got = 0
        try:
            async for o in e.generate(req(f"r{i}", max_tokens=8)):
                got += len(o.token_ids)
        except EngineError:
            return "error", got
        return "ok", got

    assert [await outcome(i) for i in range(3)] == [("ok", 8)] * 3  # no file: no faults
    path.write_text('{"error_rate": 0.5, "error_after_tokens": 2}')
    got = [await outcome(i) for i in range(3, 7)]
    assert got == [("ok", 8), ("error", 2), ("ok", 8), ("error", 2)]
    path.write_text('{"error_rate": 1.0}')
    os.utime(path, ns=(1, 1))  # a distinct mtime even within the clock's resolution
    assert [await outcome(i) for i in range(7, 9)] == [("error", 0)] * 2
    path.write_text("{}")
    assert await outcome(9) == ("ok", 8)


@pytest.mark.parametrize("step", ["batch", "own"])
async def test_sequences_step_together_or_each_on_its_own_clock(step):
    """batch: a sequence that joins between steps takes its tokens at the running one's
    steps; own: at its own phase, half a delay apart from the other's."""
    delay = 0.25
    e = engine(delay=delay, step=step)
    await e.start()
    loop = asyncio.get_running_loop()
    times: dict[str, list[float]] = {"a": [], "b": []}
    second = asyncio.Event()

    async def stamp(rid: str, tokens: int) -> None:
        async for _ in e.generate(req(rid, temperature=0, max_tokens=tokens, ignore_eos=True)):
            times[rid].append(loop.time())
            if len(times[rid]) == 2:
                second.set()

    a = asyncio.create_task(stamp("a", 5))  # it runs on past b's last token
    await second.wait()
    await asyncio.sleep(delay / 2)  # the scenario: b starts half a step after a's token
    await stamp("b", 3)
    await a
    gaps = [round(min(abs(tb - ta) for ta in times["a"]), 2) for tb in times["b"][1:]]
    if step == "batch":
        assert max(gaps) < delay / 10, (gaps, times)
    else:
        assert min(gaps) > delay / 4, (gaps, times)
