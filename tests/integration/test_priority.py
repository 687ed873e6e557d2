"""Priority classes and fair share, end to end: a real uvicorn edge with API keys in
front of a real sim worker whose batch is one or two slots, so who runs, who waits and
who is refused can be read from the order generations start in.

The edge picks each request's class (header, `service_tier`, the key's class) and sends
it with the key's name as the tenant; the worker's queue (`model_service.intake.admission`)
does the rest: headroom for a class in use above, displacement of the newest queued
generation of a lower class or of the tenant holding most, tenants in turn.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import orjson
import pytest

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from tests.integration.edge_fixtures import EDGE_ENV, wait_ready, worker_stats
from tests.procs import Proc, start_edge, start_worker
from tests.waits import eventually_async

KEYS = {
    name: f"sk-test-{name}-{secrets.token_hex(12)}" for name in ("chat", "batch", "a", "b", "c")
}
CLASSES = ("chat=high", "batch=low")  # a, b, c: normal


def auth(name: str, **headers: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[name]}", **headers}


@dataclass
class Fleet:
    worker: Proc
    edge: Proc

    @property
    def base(self) -> str:
        return f"http://{self.edge.address}"


def start(tmp: Path, *worker_args: str) -> Fleet:
    keys = tmp / "keys"
    keys.write_text(
        "".join(f"{n}:sha256:{hashlib.sha256(k.encode()).hexdigest()}\n" for n, k in KEYS.items())
    )
    worker = start_worker("--engine", "sim", "--sim-token-delay", "0.02", *worker_args)
    try:
        args = ["--worker", worker.address, "--api-keys-file", str(keys)]
        for entry in CLASSES:
            args += ["--key-priority", entry]
        edge = start_edge(*args, env=EDGE_ENV)
        wait_ready(f"http://{edge.address}")
    except BaseException:
        worker.kill()
        raise
    return Fleet(worker, edge)


@pytest.fixture
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    f = start(tmp_path, *request.param)
    try:
        yield f
    finally:
        f.edge.kill()
        f.worker.kill()


def chat(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        **extra,
    }


@dataclass
class Outcome:
    status: int = 0
    error: dict[str, Any] = field(default_factory=dict)
    priority: str | None = None
    events: int = 0


async def run(
    client: httpx.AsyncClient,
    label: str,
    key: str,
    order: list[str],
    max_tokens: int,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Outcome:
    """One streamed chat; `label` goes into `order` as its first token arrives."""
    out = Outcome()
    body = chat(max_tokens, **extra)
    async with client.stream(
        "POST", "/v1/chat/completions", json=body, headers=auth(key, **(headers or {}))
    ) as resp:
        out.status = resp.status_code
        out.priority = resp.headers.get("x-sluice-priority")
        if resp.status_code != 200:
            out.error = orjson.loads(await resp.aread())["error"]
            return out
        async for line in resp.aiter_lines():
            if not line.startswith("data: {"):
                continue
            choices = orjson.loads(line[6:])["choices"]
            if choices and choices[0]["delta"].get("content"):  # a token (not the role)
                if out.events == 0:
                    order.append(label)
                out.events += 1
    return out


def queue_is(fleet: Fleet, running: int, waiting: int):  # type: ignore[no-untyped-def]
    def check() -> bool:
        s = worker_stats(fleet.worker.address)
        return (s.running, s.waiting) == (running, waiting)

    return check


def overloaded(message: str) -> dict[str, Any]:
    return {
        "message": message,
        "type": "rate_limit_error",
        "param": None,
        "code": "overloaded",
    }


def normalized(error: dict[str, Any]) -> dict[str, Any]:
    """The error object with its retry delays blanked (they follow the drain rate)."""
    out = {k: v for k, v in error.items() if k != "retry_after_ms"}
    out["message"] = re.sub(r"\d+\.\d+s", "N.NNs", out["message"])
    return out


# -- the edge's choice of class ----------------------------------------------------------


@pytest.mark.parametrize("fleet", [()], indirect=True)
def test_the_class_comes_from_the_header_the_tier_or_the_key(fleet):
    def ask(key: str, headers: dict[str, str] | None = None, **extra: Any) -> httpx.Response:
        body = {**chat(2, **extra), "stream": False}
        return httpx.post(
            f"{fleet.base}/v1/chat/completions",
            json=body,
            headers=auth(key, **(headers or {})),
            timeout=10,
        )

    got = []
    for key, headers, extra in [
        ("a", None, {}),  # the key's class, no header back
        ("a", {"X-Sluice-Priority": "LOW"}, {}),  # lower than the key's: allowed
        ("a", None, {"service_tier": "priority"}),  # more than the key has: its own class
        ("a", None, {"service_tier": "flex"}),
        ("chat", None, {"service_tier": "default"}),
        ("chat", {"X-Sluice-Priority": "normal"}, {"service_tier": "priority"}),
        ("batch", None, {"service_tier": "scale"}),
    ]:
        r = ask(key, headers, **extra)
        got.append((r.status_code, r.headers.get("x-sluice-priority")))
    assert got == [
        (200, None),
        (200, "low"),
        (200, "normal"),
        (200, "low"),
        (200, "high"),
        (200, "normal"),
        (200, "low"),
    ]
    refused = [
        ask("a", {"X-Sluice-Priority": "high"}),
        ask("batch", {"X-Sluice-Priority": "normal"}),
        ask("a", {"X-Sluice-Priority": "urgent"}),
        ask("a", service_tier="premium"),
    ]
    assert [(r.status_code, r.json()["error"]) for r in refused] == [
        (
            403,
            {
                "message": "this API key may ask for priority normal at most",
                "type": "permission_error",
                "param": "X-Sluice-Priority",
                "code": "priority_not_allowed",
            },
        ),
        (
            403,
            {
                "message": "this API key may ask for priority low at most",
                "type": "permission_error",
                "param": "X-Sluice-Priority",
                "code": "priority_not_allowed",
            },
        ),
        (
            400,
            {
                "message": "X-Sluice-Priority must be high, normal or low",
                "type": "invalid_request_error",
                "param": "X-Sluice-Priority",
                "code": "invalid_value",
            },
        ),
        (
            400,
            {
                "message": "'service_tier' must be one of auto, default, flex, priority, scale",
                "type": "invalid_request_error",
                "param": "service_tier",
                "code": "invalid_value",
            },
        ),
    ]


# -- the worker's queue, through the edge -------------------------------------------------


@pytest.mark.parametrize(
    "fleet", [("--max-num-seqs", "2", "--max-waiting", "2", "--priority-headroom", "1")],
    indirect=True,
)  # fmt: skip
async def test_high_priority_finds_a_slot_and_lower_classes_are_refused_first(fleet):
    order: list[str] = []
    async with httpx.AsyncClient(base_url=fleet.base, timeout=30) as client:
        first = await run(client, "high", "chat", order, 2)  # high is now in use
        assert (first.status, first.priority) == (200, None)
        # A low flood: while high is in use it may take 2 - 1 slots and 4 - 1 places.
        low = {
            f"low{i}": asyncio.create_task(run(client, f"low{i}", "batch", order, 2000))
            for i in range(3)
        }
        await eventually_async(queue_is(fleet, 1, 2), what="1 low running, 2 queued", timeout=15)
        refused = await run(client, "refused", "batch", order, 2)
        # High arrives: the slot kept for it is free, so it runs at once, beside the low one.
        high = await run(client, "high2", "chat", order, 5)
        assert (high.status, high.events) == (200, 5)
        held = asyncio.create_task(run(client, "high3", "chat", order, 2000))
        await eventually_async(queue_is(fleet, 2, 2), what="high3 runs beside low", timeout=15)
        # The worker is full: the next high one displaces the newest queued low one, then
        # waits; when a slot frees it goes before the low one still queued.
        late = asyncio.create_task(run(client, "high4", "chat", order, 2))
        await eventually_async(
            lambda: sum(t.done() for t in low.values()) == 1,
            what="high4 displaced a queued low one",
            timeout=15,
        )
        running = order[1]
        low[running].cancel()
        assert (await late).status == 200
        for task in [held, *low.values()]:
            task.cancel()
        outcomes = await asyncio.gather(*low.values(), return_exceptions=True)
    assert order == ["high", running, "high2", "high3", "high4"]
    assert (refused.status, normalized(refused.error)) == (
        429,
        overloaded("worker overloaded (3 generations in flight); retry in N.NNs"),
    )
    displaced = [o for o in outcomes if isinstance(o, Outcome)]
    assert [(o.status, normalized(o.error)) for o in displaced] == [
        (
            429,
            overloaded("worker overloaded: queued generation displaced (priority); retry in N.NNs"),
        )
    ]


@pytest.mark.parametrize("fleet", [("--max-num-seqs", "1", "--max-waiting", "5")], indirect=True)
async def test_tenants_take_turns_and_a_light_one_displaces_a_flooding_one(fleet):
    order: list[str] = []
    async with httpx.AsyncClient(base_url=fleet.base, timeout=30) as client:
        holder = asyncio.create_task(run(client, "c", "c", order, 2000))  # the one slot
        await eventually_async(lambda: order == ["c"], what="c holds the slot", timeout=15)
        flood = [asyncio.create_task(run(client, "a", "a", order, 3)) for _ in range(5)]
        await eventually_async(  # the worker is full: 1 running, 5 queued
            queue_is(fleet, 1, 5), what="a's flood queued", timeout=15
        )
        light: list[asyncio.Task[Outcome]] = []

        def settled(displaced: int, refused: int) -> bool:
            done = sum(t.done() for t in light)
            return sum(t.done() for t in flood) == displaced and done == refused

        # b holds fewer: each of its first two takes the place of a's newest queued one
        # (a holds 5, then 4, against b's 0, then 1); the third finds a at 3, b at 2.
        for displaced, refused in [(1, 0), (2, 0), (2, 1)]:
            light.append(asyncio.create_task(run(client, "b", "b", order, 3)))
            await eventually_async(
                lambda d=displaced, r=refused: settled(d, r),
                what=f"{displaced} of a displaced, {refused} of b refused",
                timeout=15,
            )
        holder.cancel()
        a = await asyncio.gather(*flood)
        b = await asyncio.gather(*light)
    assert sorted((o.status, o.events) for o in a) == [(200, 3)] * 3 + [(429, 0)] * 2
    assert [(o.status, o.events) for o in b] == [(200, 3), (200, 3), (429, 0)]
    assert [normalized(o.error) for o in a if o.status == 429] == [
        overloaded("worker overloaded: queued generation displaced (fair share); retry in N.NNs")
    ] * 2
    assert normalized(b[2].error) == overloaded(
        "worker overloaded (6 generations in flight); retry in N.NNs"
    )
    # Once the slot frees, the queue takes a and b in turn.
    assert order == ["c", "a", "b", "a", "b", "a"]


# -- the queue and the RPC, over gRPC ------------------------------------------------------


def _start(rid: str, max_tokens: int, grace_ms: int = 0) -> pb.GenerateRequest:
    sp = pb.SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    start = pb.StartGeneration(request_id=rid, prompt="hi", sampling=sp, detach_grace_ms=grace_ms)
    return pb.GenerateRequest(start=start)


async def _accepted(call: grpc.aio.StreamStreamCall) -> str:
    return dict(await call.initial_metadata()).get("x-sluice-request-id", "")


async def test_a_queued_generation_is_cancelled_with_its_rpc_and_refused_by_a_drain():
    worker = start_worker(
        "--engine", "sim", "--sim-token-delay", "0.02", "--max-num-seqs", "1",
        "--max-waiting", "2", "--drain-grace", "20",
    )  # fmt: skip
    try:
        async with grpc.aio.insecure_channel(worker.address) as channel:
            stub = pb_grpc.GenerationStub(channel)
            running = stub.Generate(iter([_start("running", 2000)]))
            assert await _accepted(running) == "running"
            # Queued (the one slot is taken): no acceptance yet. Its RPC goes away, with a
            # detach grace asked for: no one knows its id, so it is cancelled, not kept.
            left = stub.Generate(iter([_start("left", 5, grace_ms=60_000)]))
            await eventually_async(
                lambda: worker_stats(worker.address).waiting == 1, what="left is queued"
            )
            left.cancel()
            await eventually_async(
                lambda: worker_stats(worker.address).waiting == 0, what="left left the queue"
            )
            # Draining: what is queued is refused at once (UNAVAILABLE: start it elsewhere)
            # while the running generation goes on within the grace.
            queued = stub.Generate(iter([_start("queued", 5)]))
            await eventually_async(
                lambda: worker_stats(worker.address).waiting == 1, what="queued is queued"
            )
            worker.proc.send_signal(signal.SIGTERM)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async for _ in queued:
                    pass
            assert (refused.value.code(), refused.value.details()) == (
                grpc.StatusCode.UNAVAILABLE,
                "worker is draining",
            )
            assert running.done() is False  # still generating while the worker drains
            running.cancel()
    finally:
        worker.kill()
