"""The constraint gate's verdict cache over a scripted compiler pool (the real pool and its
children: tests/integration/test_constraint_compile.py): a compile that ran out of time
with less than 90 % of it on a CPU (its compiler starved by busier work) is refused, and
measured again the next time; one that had the CPU, and every other verdict, is kept."""

from __future__ import annotations

import subprocess
import sys

from model_service.constraints.gate import ConstraintGate
from model_service.constraints.pool import Verdict, _cpu_s
from model_service.errors import InvalidArgument
from model_service.types import CompileJob

FIELD = "structured_output.regex"
SLOW = f"{FIELD}: compiling it for the grammar backend takes over this worker's limit of 5 s"


class ScriptedPool:
    """Answers each compile with the next verdict of its script."""

    limit_s = 5.0
    limit_mb = 1024

    def __init__(self, *verdicts: Verdict) -> None:
        self.script = list(verdicts)
        self.asked = 0

    async def compile(self, job: CompileJob) -> Verdict:
        self.asked += 1
        return self.script.pop(0)


async def _outcome(gate: ConstraintGate, job: CompileJob) -> str:
    try:
        await gate.check(job, FIELD)
    except InvalidArgument as err:
        return err.message
    return "ok"


async def test_a_starved_slow_compile_is_measured_again_a_busy_one_is_kept() -> None:
    for cpu in (0.4, 4.4):  # under 90 % of the 5-s bound on a CPU
        starved = CompileJob("regex", f"a{cpu}")
        pool = ScriptedPool(Verdict("slow", 5.0, cpu_s=cpu), Verdict("ok", 0.2))
        gate = ConstraintGate(pool)  # type: ignore[arg-type]
        assert [await _outcome(gate, starved) for _ in range(3)] == [SLOW, "ok", "ok"]
        assert (pool.asked, gate.counts.compiled, gate.counts.cached) == (2, 2, 1)

    for cpu in (4.5, 4.9, None):  # 90 % of the bound on a CPU or more, or not known: kept
        dear = CompileJob("regex", f"b{cpu}")
        pool = ScriptedPool(Verdict("slow", 5.0, cpu_s=cpu))
        gate = ConstraintGate(pool)  # type: ignore[arg-type]
        assert [await _outcome(gate, dear) for _ in range(2)] == [SLOW, SLOW]
        assert (pool.asked, gate.counts.cached) == (1, 1)


def test_a_process_cpu_seconds_are_what_it_counts_itself() -> None:
    """`_cpu_s` (what a slow verdict carries) against the process's own `process_time`."""
    burn = "while time.process_time() < 0.3:\n    pass\nprint(time.process_time(), flush=True)"
    code = f"import sys, time\n{burn}\nsys.stdin.read()"
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        own = float(child.stdout.readline())  # it waits on its stdin from here: no CPU
        seen = _cpu_s(child.pid)
        assert seen is not None and abs(seen - own) <= 0.03, (seen, own)
    finally:
        child.kill()
        child.wait()
    assert _cpu_s(child.pid) is None  # gone
