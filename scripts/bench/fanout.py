"""The same load split over several harness processes, merged into one result.

One Python process tops out at one core, and may hold at most `ulimit -n` sockets;
`--procs N` runs N spawned processes, each with its share of the concurrency or rate and
its own seed. Each sets up and warms up, then all cross a barrier and start together.
Their times are CLOCK_MONOTONIC readings, shared by all processes, so records merge as is.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from scripts.bench.load import Driver, LoadConfig, LoadResult, run_load
from scripts.bench.progress import Progress
from scripts.bench.workload import WorkloadConfig, make_workload

DriverFactory = Callable[[], Driver]
BARRIER_TIMEOUT_S = 600.0


def use_uvloop() -> None:
    """uvloop when installed (uvicorn[standard] brings it): a cheaper event loop."""
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def run_in_process(
    factory: DriverFactory,
    workload: WorkloadConfig,
    load: LoadConfig,
    progress: Progress,
    seed_offset: int = 0,
    ready: Callable[[], Awaitable[None]] | None = None,
) -> LoadResult:
    """Set up one driver, run the load, close the driver."""
    driver = factory()
    await driver.setup()
    try:
        return await run_load(driver, make_workload(workload, seed_offset), load, progress, ready)
    finally:
        await driver.close()


def _child(
    factory: DriverFactory,
    workload: WorkloadConfig,
    load: LoadConfig,
    index: int,
    show: bool,
    barrier: Any,
    results: Any,
) -> None:
    use_uvloop()

    async def ready() -> None:
        await asyncio.to_thread(barrier.wait, BARRIER_TIMEOUT_S)

    progress = Progress(f"proc {index}", enabled=show)
    try:
        result = asyncio.run(run_in_process(factory, workload, load, progress, index, ready))
        results.put((index, result, ""))
    except BaseException as exc:
        barrier.abort()
        results.put((index, None, f"{type(exc).__name__}: {exc}"))


def run_fanout(
    factory: DriverFactory,
    workload: WorkloadConfig,
    load: LoadConfig,
    procs: int,
    show_progress: bool,
    on_start: Callable[[], None] | None = None,
) -> LoadResult:
    """Run `load` split over `procs` processes; `factory` must be picklable. `on_start`
    runs here when every process has warmed up and measuring begins."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs + 1)  # the children and this process
    results = ctx.Queue()
    children = [
        ctx.Process(
            target=_child,
            args=(
                factory,
                workload,
                load.share(i, procs),
                i,
                show_progress and i == 0,
                barrier,
                results,
            ),
            daemon=True,
        )
        for i in range(procs)
    ]
    for child in children:
        child.start()
    try:
        barrier.wait(BARRIER_TIMEOUT_S)
        if on_start is not None:
            on_start()
    except threading.BrokenBarrierError:
        pass  # a child failed before measuring; its error arrives below
    parts: list[LoadResult] = []
    failures: list[str] = []
    for _ in children:
        _, result, error = results.get()
        if result is None:
            failures.append(error)
        else:
            parts.append(result)
    for child in children:
        child.join()
    if failures:
        raise RuntimeError("harness process failed: " + "; ".join(failures))
    merged = LoadResult(parts[0].label, procs=procs)
    for part in parts:
        merged.records.extend(part.records)
        merged.cancelled += part.cancelled
        merged.cpu_s += part.cpu_s
    merged.start_ns = min(p.start_ns for p in parts)
    merged.stop_ns = max(p.stop_ns for p in parts)
    merged.end_ns = max(p.end_ns for p in parts)
    return merged
