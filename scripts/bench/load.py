"""Load generation: a closed loop at fixed concurrency or an open loop of Poisson arrivals.

Closed loop (`concurrency`): N virtual users, each sending its next request as soon as the
last one ended, optionally started `ramp` per second (so 20,000 connections do not hit one
listen backlog at once). Open loop (`rate`): arrivals with exponential gaps whatever the
server's speed, optionally capped at `max_concurrency` in flight (arrivals then wait).
Either is bounded by a duration and/or a request count; requests in flight when the
bound is reached run to their end, for at most `drain_timeout_s`, then are cancelled.
Warm-up requests run first and are discarded.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from scripts import options as shared
from scripts.bench.progress import Progress
from scripts.bench.record import RequestRecord, refresh_wall_offset
from scripts.bench.workload import RequestSpec, Source
from sluice_common.options import option


class Driver(Protocol):
    """One transport to one target (`openai_driver.OpenAIDriver`, `grpc_driver.GrpcDriver`)."""

    name: str

    async def setup(self) -> None: ...

    async def request(self, spec: RequestSpec) -> RequestRecord: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """How much load, for how long (the `load` options)."""

    concurrency: int = shared.concurrency(8, "closed loop: streams in flight")
    rate: float = option(0.0, "--rate", "open loop: Poisson arrivals/s")  # > 0: open loop
    max_concurrency: int = option(0, "--max-concurrency", "open loop cap (0 = none)")
    # Neither bound given: 10 s (`config.config_from_args`).
    duration_s: float = shared.duration(0.0, "seconds of issuing requests")
    requests: int = option(0, "--requests", "requests to send (per round)")
    warmup: int = option(0, "--warmup", "discarded requests first")
    ramp: float = option(0.0, "--ramp", "closed loop: streams started/s (0 = all at once)")
    drain_timeout_s: float = option(
        60.0, "--drain-timeout", "seconds requests in flight may finish once a bound is reached"
    )
    seed: int = 0  # the workload's (--seed)

    def share(self, i: int, n: int) -> LoadConfig:
        """Process `i` of `n`'s part of this load (fan-out)."""

        def part(total: int) -> int:
            return total // n + (1 if i < total % n else 0)

        return LoadConfig(
            concurrency=part(self.concurrency),
            rate=self.rate / n,
            max_concurrency=part(self.max_concurrency),
            duration_s=self.duration_s,
            requests=part(self.requests),
            warmup=part(self.warmup),
            ramp=self.ramp / n,
            drain_timeout_s=self.drain_timeout_s,
            seed=self.seed * 7919 + i,
        )


@dataclass(slots=True)
class LoadResult:
    """The measured requests of one run and the run's time window."""

    label: str
    records: list[RequestRecord] = field(default_factory=list)
    start_ns: int = 0  # measuring began
    stop_ns: int = 0  # issuing stopped (bound reached)
    end_ns: int = 0  # last request ended
    cancelled: int = 0  # still in flight after the drain timeout
    cpu_s: float = 0.0  # harness CPU time (all its processes)
    procs: int = 1
    processes: dict[str, dict[str, float]] = field(default_factory=dict)  # watched servers


async def run_load(
    driver: Driver,
    workload: Source,
    cfg: LoadConfig,
    progress: Progress,
    ready: Callable[[], Awaitable[None]] | None = None,
) -> LoadResult:
    """Warm up, await `ready` (fan-out: all processes start together), run, return records."""
    if cfg.warmup:
        warm = LoadConfig(concurrency=min(cfg.warmup, max(1, cfg.concurrency)), requests=cfg.warmup)
        await _closed_loop(driver, workload, warm, Progress("warm-up", False), [])
    if ready is not None:
        await ready()
    refresh_wall_offset()
    result = LoadResult(driver.name)
    cpu0 = time.process_time()
    result.start_ns = time.perf_counter_ns()
    progress.start()
    loop = _open_loop if cfg.rate > 0 else _closed_loop
    try:
        result.stop_ns, result.cancelled = await loop(
            driver, workload, cfg, progress, result.records
        )
    finally:
        await progress.stop()
    result.end_ns = max((r.end_ns for r in result.records), default=time.perf_counter_ns())
    result.cpu_s = time.process_time() - cpu0
    return result


class _Bound:
    """Whether another request may be issued (time and count bounds)."""

    def __init__(self, cfg: LoadConfig) -> None:
        self.cfg = cfg
        self.issued = 0
        self.deadline = time.perf_counter_ns() + int(cfg.duration_s * 1e9) if cfg.duration_s else 0
        self.stopped_ns = 0

    def take(self) -> bool:
        if (self.cfg.requests and self.issued >= self.cfg.requests) or (
            self.deadline and time.perf_counter_ns() >= self.deadline
        ):
            self.stopped_ns = self.stopped_ns or time.perf_counter_ns()
            return False
        self.issued += 1
        return True


async def _one(
    driver: Driver,
    workload: Source,
    spec: RequestSpec,
    progress: Progress,
    out: list[RequestRecord],
) -> None:
    progress.started()
    try:
        rec = await driver.request(spec)
    except Exception as exc:  # a harness bug must show up as an error, not end the run
        rec = RequestRecord(target=driver.name).fail("harness", f"{type(exc).__name__}: {exc}")
    workload.done(spec, rec)
    out.append(rec)
    progress.finished(rec)


async def _drain(tasks: set[asyncio.Task[None]], cfg: LoadConfig, bound: _Bound) -> int:
    """Wait for the tasks up to the drain timeout after the bound; cancel the rest."""
    if not tasks:
        return 0
    while bound.stopped_ns == 0 and tasks:
        # The time bound ends issuing even while every user is mid-request.
        timeout = None
        if bound.deadline:
            timeout = max(0.0, (bound.deadline - time.perf_counter_ns()) / 1e9) + 0.001
        done, _ = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        tasks -= done
        if bound.deadline and time.perf_counter_ns() >= bound.deadline:
            bound.stopped_ns = bound.stopped_ns or bound.deadline
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=cfg.drain_timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return len(pending)
    return 0


async def _closed_loop(
    driver: Driver,
    workload: Source,
    cfg: LoadConfig,
    progress: Progress,
    out: list[RequestRecord],
) -> tuple[int, int]:
    bound = _Bound(cfg)

    async def user(i: int) -> None:
        if cfg.ramp > 0 and i:
            await asyncio.sleep(i / cfg.ramp)
        while bound.take():
            await _one(driver, workload, workload.next(), progress, out)

    tasks = {asyncio.create_task(user(i)) for i in range(max(1, cfg.concurrency))}
    cancelled = await _drain(tasks, cfg, bound)
    return bound.stopped_ns or time.perf_counter_ns(), min(cancelled, progress.inflight)


async def _open_loop(
    driver: Driver,
    workload: Source,
    cfg: LoadConfig,
    progress: Progress,
    out: list[RequestRecord],
) -> tuple[int, int]:
    bound = _Bound(cfg)
    rng = random.Random(cfg.seed + 17)
    slots = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
    tasks: set[asyncio.Task[None]] = set()

    async def arrival(spec: RequestSpec) -> None:
        if slots is None:
            await _one(driver, workload, spec, progress, out)
            return
        async with slots:
            await _one(driver, workload, spec, progress, out)

    next_ns = time.perf_counter_ns()
    while True:
        next_ns += int(rng.expovariate(cfg.rate) * 1e9)
        delay = (next_ns - time.perf_counter_ns()) / 1e9
        if delay > 0:
            await asyncio.sleep(delay)
        if not bound.take():
            break
        task = asyncio.create_task(arrival(workload.next()))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    stopped = bound.stopped_ns
    cancelled = await _drain(set(tasks), cfg, bound)
    return stopped, cancelled
