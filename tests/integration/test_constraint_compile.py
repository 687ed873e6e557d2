"""The constraint gate over real compiler processes (xgrammar over a small vocabulary):
verdicts, their cache, a compile shared by its callers, the time and memory bounds, and a
compile abandoned when its caller left (its child killed, the slot working again)."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from model_service.constraints.gate import ConstraintGate
from model_service.constraints.pool import CompilerPool
from model_service.errors import InvalidArgument
from model_service.types import CompileJob
from tests.waits import eventually_async

xgr = pytest.importorskip("xgrammar")

FIELD = "structured_output.json_schema"
LIMIT_S = 0.3


def _vocab() -> str:
    words = [chr(c) for c in range(32, 127)] + [f"w{i}" for i in range(300)] + ["</s>"]
    return str(xgr.TokenizerInfo(words, stop_token_ids=[len(words) - 1]).serialize_json())


def _props(n: int, first: int = 0) -> CompileJob:
    props = {f"p{i}": {"type": "string"} for i in range(first, first + n)}
    return CompileJob("json_schema", json.dumps({"type": "object", "properties": props}))


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


async def _refusal(gate: ConstraintGate, job: CompileJob) -> str:
    with pytest.raises(InvalidArgument) as err:
        await gate.check(job, FIELD)
    return err.value.message


async def test_verdicts_cached_shared_bounded_in_time_and_abandoned_with_their_caller() -> None:
    pool = CompilerPool(_vocab(), 2, LIMIT_S, 1024)
    pool.start()
    # The children read a file with no name: nothing to leave in /tmp, however it ends.
    assert os.readlink(pool.vocab_path).endswith(" (deleted)"), os.readlink(pool.vocab_path)
    gate = ConstraintGate(pool)
    try:
        small = _props(3)
        await gate.check(small, FIELD)  # waits for a child to start, then compiles
        await gate.check(small, FIELD)  # the cached verdict: no child asked
        assert (gate.counts.compiled, gate.counts.cached) == (1, 1)
        shared = _props(20)
        await asyncio.gather(gate.check(shared, FIELD), gate.check(shared, FIELD))
        assert (gate.counts.compiled, gate.counts.cached) == (2, 1)
        # Compilers take only CPU nothing else wants.
        assert {os.sched_getscheduler(pid) for pid in pool.pids} == {os.SCHED_IDLE}

        message = await _refusal(gate, CompileJob("regex", "(a"))
        assert message.startswith(f"{FIELD}: the grammar backend refused it: ")
        assert "parenthesis is not closed" in message

        # 3,000 optional properties take seconds even over 400 tokens: over the bound.
        t0 = time.monotonic()
        message = await _refusal(gate, _props(3_000))
        took = time.monotonic() - t0
        assert message == (
            f"{FIELD}: compiling it for the grammar backend takes over this worker's limit "
            f"of {LIMIT_S:g} s"
        )
        assert LIMIT_S <= took < LIMIT_S + 1.0
        assert (gate.counts.compiled, gate.counts.refused) == (4, 2)

        # The caller leaves during a slow compile: its child is killed, a new one serves.
        caller = asyncio.create_task(gate.check(_props(3_000, first=1), FIELD))
        busy = await eventually_async(lambda: set(pool.busy), what="a child compiling")
        caller.cancel()
        await asyncio.gather(caller, return_exceptions=True)
        assert gate.counts.abandoned == 1
        await eventually_async(
            lambda: not any(_alive(pid) for pid in busy), what="the abandoned child gone"
        )
        await gate.check(_props(5), FIELD)
        assert not busy & set(pool.pids)
    finally:
        await pool.close()
    assert pool.pids == []


async def test_a_compile_over_the_memory_bound_is_refused_naming_it() -> None:
    pool = CompilerPool(_vocab(), 1, 10.0, 1)
    pool.start()
    gate = ConstraintGate(pool)
    try:
        message = await _refusal(gate, _props(2_000))
        assert message == (
            f"{FIELD}: compiling it for the grammar backend needs over this worker's limit of 1 MiB"
        )
    finally:
        await pool.close()
