"""The gate a new constraint passes before it reaches the engine: its compile, measured in
a bounded child (`pool.py`), refused over the time or memory bound with INVALID_ARGUMENT
naming the field and the limit. Verdicts are kept by the constraint's hash, so a repeated
constraint costs a dictionary lookup; callers of the same constraint share one compile,
which is abandoned (its child killed) once the last of them left."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from model_service.config import LimitsConfig
from model_service.constraints.pool import CompilerPool, Verdict
from model_service.errors import InvalidArgument
from model_service.types import CompileJob

log = logging.getLogger("sluice.constraints")

CACHE_VERDICTS = 4096
CONCLUSIVE = 0.9  # of the time bound on a CPU: a slow verdict kept


@dataclass(slots=True)
class _Flight:
    """One compile in progress and how many callers wait for it."""

    task: asyncio.Task[Verdict] | None = None
    waiters: int = 0


@dataclass(slots=True)
class GateCounts:
    compiled: int = 0
    cached: int = 0
    refused: int = 0
    abandoned: int = 0


class ConstraintGate:
    """Measures each new constraint's compile once (see module docstring)."""

    def __init__(self, pool: CompilerPool, cache_size: int = CACHE_VERDICTS) -> None:
        self.pool = pool
        self.counts = GateCounts()
        self._cache: OrderedDict[bytes, Verdict] = OrderedDict()
        self._cache_size = cache_size
        self._flights: dict[bytes, _Flight] = {}

    async def check(self, job: CompileJob, field: str) -> None:
        """Return once `job` compiles within the bounds; else raise InvalidArgument naming
        `field` (Overloaded when every compiler stays busy)."""
        key = job.digest()
        verdict = self._cache.get(key)
        if verdict is not None:
            self._cache.move_to_end(key)
            self.counts.cached += 1
        else:
            verdict = await self._await(key, job)
        self._judge(verdict, field)

    async def _await(self, key: bytes, job: CompileJob) -> Verdict:
        flight = self._flights.get(key)
        if flight is None:
            flight = self._flights[key] = _Flight()
            flight.task = asyncio.get_running_loop().create_task(self._run(key, job, flight))
        assert flight.task is not None
        flight.waiters += 1
        try:
            return await asyncio.shield(flight.task)
        finally:
            flight.waiters -= 1
            if flight.waiters == 0 and not flight.task.done():  # every caller left
                self.counts.abandoned += 1
                self._flights.pop(key, None)
                flight.task.cancel()  # the pool kills its child and frees the slot

    async def _run(self, key: bytes, job: CompileJob, flight: _Flight) -> Verdict:
        try:
            verdict = await self.pool.compile(job)
        finally:
            if self._flights.get(key) is flight:
                del self._flights[key]
        self.counts.compiled += 1
        if self._conclusive(verdict):
            self._cache[key] = verdict
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        if verdict.kind != "ok":
            log.info(
                "constraint refused (%s) after %.2fs (%s CPU s)",
                verdict.kind,
                verdict.seconds,
                verdict.cpu_s,
            )
        return verdict

    def _conclusive(self, verdict: Verdict) -> bool:
        """Whether the verdict holds next time too: not a compile that ran out of time with
        less than 90 % of it on a CPU (its compiler runs only on CPU the streams leave
        idle, and 3 s of work starved to 2.6 s in 5 says nothing; refused now, measured
        again when it comes back)."""
        cpu = verdict.cpu_s
        return verdict.kind != "slow" or cpu is None or cpu >= CONCLUSIVE * self.pool.limit_s

    def _judge(self, verdict: Verdict, field: str) -> None:
        if verdict.kind == "ok":
            return
        self.counts.refused += 1
        if verdict.kind == "slow":
            raise InvalidArgument(
                field,
                "compiling it for the grammar backend takes over this worker's limit of "
                f"{self.pool.limit_s:g} s",
            )
        if verdict.kind == "memory":
            raise InvalidArgument(
                field,
                "compiling it for the grammar backend needs over this worker's limit of "
                f"{self.pool.limit_mb} MiB",
            )
        raise InvalidArgument(field, f"the grammar backend refused it: {verdict.message}")


async def open_gate(
    vocab: Callable[[], Awaitable[str | None]], limits: LimitsConfig
) -> ConstraintGate | None:
    """A gate over `--constraint-compilers` compilers, their children starting in the
    background; None when that is 0 or the engine names no vocabulary (`vocab()`,
    `Engine.grammar_vocab`): constraints then go to the engine unmeasured."""
    if limits.constraint_compilers < 1:
        return None
    try:
        text = await vocab()
    except Exception:  # the backend's vocabulary would not build: serve unmeasured
        log.exception("constraint compiles are not measured: no vocabulary")
        return None
    if text is None:
        return None
    pool = CompilerPool(
        text,
        limits.constraint_compilers,
        limits.max_constraint_compile_s,
        limits.max_constraint_compile_mb,
    )
    pool.start()
    return ConstraintGate(pool)
