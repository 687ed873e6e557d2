"""The constraint gate's verdict cache over a scripted compiler pool (the real pool and its
children: tests/integration/test_constraint_compile.py): a compile that ran out of time
with under half of it on a CPU (its compiler starved by busier work) is refused, and
measured again the next time; one that had the CPU, and every other verdict, is kept."""

from __future__ import annotations

from model_service.constraints.gate import ConstraintGate
from model_service.constraints.pool import Verdict
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
    starved = CompileJob("regex", "a+")
    pool = ScriptedPool(Verdict("slow", 5.0, cpu_s=0.4), Verdict("ok", 0.2))
    gate = ConstraintGate(pool)  # type: ignore[arg-type]
    assert [await _outcome(gate, starved) for _ in range(3)] == [SLOW, "ok", "ok"]
    assert (pool.asked, gate.counts.compiled, gate.counts.cached) == (2, 2, 1)

    for cpu in (2.5, 4.9, None):  # half the bound on a CPU or more, or not known: kept
        dear = CompileJob("regex", f"b{cpu}")
        pool = ScriptedPool(Verdict("slow", 5.0, cpu_s=cpu))
        gate = ConstraintGate(pool)  # type: ignore[arg-type]
        assert [await _outcome(gate, dear) for _ in range(2)] == [SLOW, SLOW]
        assert (pool.asked, gate.counts.cached) == (1, 1)
