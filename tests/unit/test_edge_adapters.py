"""The edge's adapter bookkeeping: a worker's free slots and warmth from what it listed and
pushed, and `--lora-autoload` (one load for concurrent requests, the least loaded worker
with a free slot, 503 when none has one)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from edge.config import RoutingConfig
from edge.errors import ApiError
from edge.routing.adapters import AdapterRouting
from edge.routing.registry import PoolRegistry
from edge.upstream.worker import Worker
from generated import sluice_pb2 as pb


def _models(slots: int, *adapters: str) -> list[pb.ModelInfo]:
    return [
        pb.ModelInfo(id="base", max_adapters=slots),
        *(pb.ModelInfo(id=a, parent="base", path=f"/a/{a}") for a in adapters),
    ]


class FakeWorker:
    """What `AdapterRouting` reads of a worker, with `Worker`'s own slot arithmetic."""

    adapter_room = Worker.adapter_room
    holds = Worker.holds

    def __init__(self, address: str, load: int, slots: int, *adapters: str) -> None:
        self.address = address
        self.load = load
        self.models = _models(slots, *adapters)
        self.loads: list[tuple[str, str]] = []

    def routable(self) -> bool:
        return True

    async def load_adapter(self, name: str, path: str) -> pb.ModelInfo:
        await asyncio.sleep(0)  # a real RPC yields: concurrent requests meet here
        self.loads.append((name, path))
        self.models.append(pb.ModelInfo(id=name, parent="base", path=path))
        return self.models[-1]


def _routing(workers: list[FakeWorker], autoload: bool = True) -> AdapterRouting:
    opts = RoutingConfig(loras=["b=/a/b"], lora_autoload=autoload)
    registry = cast(PoolRegistry, type("R", (), {"workers": workers})())
    return AdapterRouting(registry, opts)


def test_free_slots_and_warmth_come_from_the_listing_and_the_push() -> None:
    w = cast(Any, FakeWorker("h:1", 0, 2, "a"))
    assert (w.adapter_room(), w.holds("a"), w.holds("base"), w.holds("b")) == (1, True, True, False)
    w.models = []
    assert w.adapter_room() == 0  # not listed yet: no room to count on
    real = Worker.__new__(Worker)
    real.reported, real.in_flight, real._reported_load = None, 0, -1
    assert not real.warm("a")
    real.reported = pb.WorkerLoad(active_adapters=["a"], max_running=2, running=1)
    real._reported_load, real._in_flight_at_report = 1, 0
    assert (real.warm("a"), real.warm("b")) == (True, False)
    real._reported_load = 2  # its batch is full: warmth gives way to load
    assert not real.warm("a")


def test_autoload_loads_once_on_the_least_loaded_worker_with_a_free_slot() -> None:
    busy, idle, full = (
        FakeWorker("h:1", 5, 2),
        FakeWorker("h:2", 1, 1),
        FakeWorker("h:3", 0, 1, "a"),
    )

    async def run() -> None:
        routing = _routing([busy, idle, full])
        await asyncio.gather(*(routing.ensure("b") for _ in range(3)))
        await routing.ensure("b")  # held now: nothing to do
        await routing.ensure("unknown")  # not known: the pick's 404
        await routing.ensure("base")

    asyncio.run(run())
    assert (busy.loads, idle.loads, full.loads) == ([], [("b", "/a/b")], [])


def test_autoload_off_or_no_slot_anywhere() -> None:
    one = FakeWorker("h:1", 0, 1, "a")

    async def run() -> None:
        await _routing([one], autoload=False).ensure("b")
        with pytest.raises(ApiError) as info:
            await _routing([one]).ensure("b")
        assert (info.value.status, info.value.code) == (503, "adapter_slots_full")

    asyncio.run(run())
    assert one.loads == []
