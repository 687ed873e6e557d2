"""Scripted stand-ins for what the edge's two stream state machines talk to, so that
every ordering of `FailoverCall` and `GenerationResponse` runs in milliseconds (as httpx
tests its client through `MockTransport`):

- `ScriptedCall`: an `UpstreamCall` that plays a list of steps (accept, refuse, chunks,
  a final, a failure, a hang until a `Gate` opens), recording what was asked of it;
- `Upstream`: a `FailoverCall`'s `open_call`, one script per attempt on each worker;
- `ScriptedPicker`: a `Picker` over real `Worker` objects built on `NoChannels` (no
  channel, no socket: a real RPC would fail the test), recording picks and releases;
- `Client`: an in-memory ASGI receive/send pair that records every message sent and
  delivers `http.disconnect` when the test says so.

Nothing here sleeps: tests wait on `Gate.reached` and `Client.until`, each bounded.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from starlette.types import ASGIApp, Message

from edge.config import RoutingConfig
from edge.errors import ApiError, from_status, no_worker

# The Picker protocol's metrics type, taken from where failover itself gets it.
from edge.upstream.calls import Sink
from edge.upstream.failover import PoolMetrics
from edge.upstream.worker import SERVING, Worker
from generated import sluice_pb2 as pb

WAIT_S = 5.0  # the longest any wait here takes before it fails the test


# -- steps ------------------------------------------------------------------------------


class Gate:
    """A point a script stops at: `reached` once a call waits there, `open()` lets it on."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.opened = asyncio.Event()

    def open(self) -> None:
        self.opened.set()

    async def wait_reached(self) -> None:
        async with asyncio.timeout(WAIT_S):
            await self.reached.wait()


@dataclass(frozen=True)
class Accept:
    """The worker accepted the generation (its response headers): `admitted()` is True."""


@dataclass(frozen=True)
class Over:
    """The RPC ended before `admitted()` saw its headers (a very short generation): the
    messages that follow are still read."""


@dataclass(frozen=True)
class Hang:
    """Wait at `gate` (or until the call is cancelled)."""

    gate: Gate


@dataclass(frozen=True)
class Do:
    """Run `fn` when the script gets here (e.g. advance a fake clock)."""

    fn: Callable[[], object]


@dataclass(frozen=True)
class Chunk:
    text: str
    tokens: int = 1


@dataclass(frozen=True)
class End:
    """The `final`; `completion` None: the tokens this call sent."""

    reason: int = pb.FINISH_REASON_STOP
    prompt: int = 7
    completion: int | None = None
    error: pb.Status | None = None


@dataclass(frozen=True)
class Fail:
    """A refusal (as the first step) or a failure: the RPC's status as GenerateCall maps
    it. `code` None: the stream broke (it ended without a final message)."""

    code: grpc.StatusCode | None = None
    message: str = ""
    retry_after_ms: int = 0
    field: str = ""

    def error(self) -> ApiError:
        if self.code is None:  # GenerateCall's own error for a stream cut short
            return ApiError(
                502,
                "upstream stream ended without a final message",
                type="server_error",
                code="upstream_error",
            )
        return from_status(
            self.code, self.message, field=self.field, retry_after_ms=self.retry_after_ms
        )


BROKEN = Fail()
UNAVAILABLE = Fail(grpc.StatusCode.UNAVAILABLE, "the worker is draining")
OVERLOADED = Fail(grpc.StatusCode.RESOURCE_EXHAUSTED, "no batch slot free", retry_after_ms=1500)
Step = Accept | Over | Hang | Do | Chunk | End | Fail
_ADMISSION = (Accept, Over)
_HOOKS = (Hang, Do)


# -- the call ---------------------------------------------------------------------------


class ScriptedCall:
    """An `UpstreamCall` playing `steps`; messages are indexed from `first_index` on."""

    def __init__(
        self,
        worker: Worker,
        steps: Iterable[Step],
        *,
        request_id: str = "req",
        start: pb.StartGeneration | None = None,
        first_index: int = 0,
        timeout_s: float | None = None,
    ) -> None:
        self.worker = worker
        self.start = start
        self.request_id = start.request_id if start is not None else request_id
        self.timeout_s = timeout_s
        self.steps: deque[Step] = deque(steps)
        self.next_index = first_index
        self.tokens = 0
        self.messages: list[pb.GenerateResponse] = []  # every message read
        self.admissions = 0
        self.settles = 0
        self.cancels = 0
        self.ended = False  # a final was read, or a failure raised
        self.aborted = False  # cancel() came while the call was still open
        self.answered = asyncio.Event()  # admitted() returned (whatever it said)
        self.settling: Gate | None = None  # settle() waits here when set
        self._cancelled = asyncio.Event()

    async def admitted(self) -> bool:
        self.admissions += 1
        await self._hooks()
        self.answered.set()
        if self._cancelled.is_set():
            return False  # as grpc's: the RPC ended (cancelled)
        step = self.steps[0] if self.steps else None
        if isinstance(step, _ADMISSION):
            self.steps.popleft()
            return isinstance(step, Accept)
        return not isinstance(step, Fail)  # a refusal: the RPC ended

    async def read(self, sink: Sink | None = None) -> pb.GenerateResponse:
        while True:
            await self._hooks()
            if self._cancelled.is_set():
                self.ended = True
                raise from_status(grpc.StatusCode.CANCELLED, "Locally cancelled by application!")
            assert self.steps, f"{self.worker.address}: read past the end of its script"
            step = self.steps.popleft()
            if isinstance(step, _ADMISSION):
                continue
            if isinstance(step, Fail):
                self.ended = True
                raise step.error()
            msg = pb.GenerateResponse(request_id=self.request_id, index=self.next_index)
            if isinstance(step, Chunk):
                msg.chunk.text = step.text
                msg.chunk.token_ids.extend(range(100, 100 + step.tokens))
                self.tokens += step.tokens
            else:
                assert isinstance(step, End)
                msg.final.reason = step.reason  # type: ignore[assignment]
                msg.final.usage.prompt_tokens = step.prompt
                completion = self.tokens if step.completion is None else step.completion
                msg.final.usage.completion_tokens = completion
                if step.error is not None:
                    msg.final.error.CopyFrom(step.error)
                self.ended = True
            self.next_index += 1
            self.messages.append(msg)
            if sink is not None and isinstance(step, Chunk) and sink.ready():
                sink.take(msg)  # as a session hands chunks on: from the reader, no return
                continue
            return msg

    async def settle(self, timeout_s: float) -> bool:
        self.settles += 1
        if self.settling is not None:
            self.settling.reached.set()
            await self.settling.opened.wait()
        return self.ended and not self._cancelled.is_set()

    def cancel(self) -> None:
        self.cancels += 1
        if not self.ended and not self._cancelled.is_set():
            self.aborted = True
        self._cancelled.set()

    async def _hooks(self) -> None:
        while self.steps and isinstance(self.steps[0], _HOOKS):
            step = self.steps.popleft()
            if isinstance(step, Do):
                step.fn()
                continue
            assert isinstance(step, Hang)
            step.gate.reached.set()
            waits = [
                asyncio.ensure_future(step.gate.opened.wait()),
                asyncio.ensure_future(self._cancelled.wait()),
            ]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()


class Upstream:
    """A `FailoverCall`'s `open_call`: for each worker address, the scripts of its
    attempts in order. An attempt nobody scripted fails the test."""

    def __init__(self, scripts: dict[str, list[list[Step]]]) -> None:
        self._scripts = {address: deque(each) for address, each in scripts.items()}
        self.calls: list[ScriptedCall] = []

    def __call__(
        self,
        worker: Worker,
        start: pb.StartGeneration,
        timeout_s: float | None,
        trace_id: str,
        traceparent: str,
    ) -> ScriptedCall:
        queue = self._scripts.get(worker.address)
        assert queue, f"an attempt on {worker.address} that no script expects"
        call = ScriptedCall(worker, queue.popleft(), start=start, timeout_s=timeout_s)
        self.calls.append(call)
        return call

    @property
    def attempts(self) -> list[str]:
        """The worker address of every attempt, in order."""
        return [c.worker.address for c in self.calls]


# -- workers and the picker -------------------------------------------------------------


class _NoChannel:
    """Stands for a worker's channel: any RPC on it fails the test."""

    def _rpc(self, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("a scripted test made a real RPC")

        return refuse

    unary_unary = unary_stream = stream_unary = stream_stream = _rpc

    async def close(self, grace: float | None = None) -> None:
        return None


class NoChannels:
    """A `ChannelFactory` of channels that never connect."""

    stream_window_bytes = 256 * 1024

    def open(self, address: str) -> Any:
        return _NoChannel()


def make_worker(address: str, pool: str = "stable", opts: RoutingConfig | None = None) -> Worker:
    """A real, SERVING `Worker` with no channel under it."""
    w = Worker(address, pool, NoChannels(), opts or RoutingConfig())  # type: ignore[arg-type]
    w.status = SERVING
    return w


@dataclass(frozen=True)
class Pick:
    model: str
    key: str
    exclude: frozenset[str]
    prefer_pool: str
    prompt: Any
    chosen: str  # "" when none was left


@dataclass
class ScriptedPicker:
    """A `Picker`: the first routable worker not excluded, its pool preferred."""

    workers: list[Worker]
    options: RoutingConfig = field(default_factory=RoutingConfig)
    picks: list[Pick] = field(default_factory=list)
    releases: list[str] = field(default_factory=list)
    metrics: dict[str, PoolMetrics] = field(default_factory=dict)

    def pick(
        self,
        model: str = "",
        key: str = "",
        exclude: Collection[str] = (),
        prefer_pool: str = "",
        pool: str = "",
        prompt: Any = None,
    ) -> Worker:
        free = [w for w in self.workers if w.address not in exclude and w.routable()]
        same = [w for w in free if w.pool == prefer_pool]
        chosen = (same or free)[0] if free else None
        address = chosen.address if chosen is not None else ""
        self.picks.append(Pick(model, key, frozenset(exclude), prefer_pool, prompt, address))
        if chosen is None:
            raise no_worker()
        return chosen

    def pool_metrics(self, pool: str) -> PoolMetrics:
        return self.metrics.setdefault(pool, PoolMetrics())

    def released(self, worker: Worker) -> None:
        self.releases.append(worker.address)

    def outcomes(self, pool: str = "stable") -> dict[str, int]:
        return self.pool_metrics(pool).outcomes


# -- the ASGI client --------------------------------------------------------------------


class Client:
    """One HTTP request's ASGI receive/send, in memory.

    `receive` waits until `leave()` (the body was read already, as uvicorn's does), then
    says `http.disconnect`; with `leave_when_complete` that comes as the response's last
    byte goes out (uvicorn reports one then too). `send` records each message; while
    `gate` is set and not open, each send waits at it first (a client not reading).
    """

    def __init__(
        self, *, http_version: str = "1.1", path: str = "/v1/chat/completions", gzip: bool = False
    ) -> None:
        self.scope: dict[str, Any] = {
            "type": "http",
            "http_version": http_version,
            "method": "POST",
            "path": path,
            "headers": [(b"accept-encoding", b"gzip")] if gzip else [],
        }
        self.sent: list[Message] = []
        self.gate: Gate | None = None
        self.leave_when_complete = False
        self.cancelling = -1  # the request task's cancelling() when the app returned
        self._left = asyncio.Event()
        self._changed = asyncio.Event()

    async def receive(self) -> Message:
        await self._left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        gate = self.gate
        if gate is not None and not gate.opened.is_set():
            gate.reached.set()
            async with asyncio.timeout(WAIT_S):  # bounded: a failed test must not hang
                await gate.opened.wait()
        self.sent.append(message)
        self._changed.set()
        if self.leave_when_complete and self.complete:
            self.leave()

    def leave(self) -> None:
        self._left.set()

    def run(self, app: ASGIApp) -> asyncio.Task[None]:
        """Run `app` in its own task, as uvicorn runs a request."""

        async def request() -> None:
            try:
                await app(self.scope, self.receive, self.send)
            finally:
                task = asyncio.current_task()
                assert task is not None
                self.cancelling = task.cancelling()

        return asyncio.create_task(request())

    async def until(self, check: Callable[[Client], bool]) -> None:
        """Wait (bounded) until `check(self)` holds after some send."""
        async with asyncio.timeout(WAIT_S):
            while not check(self):
                self._changed.clear()
                await self._changed.wait()

    # -- what was sent ------------------------------------------------------------------

    @property
    def status(self) -> int | None:
        starts = [m for m in self.sent if m["type"] == "http.response.start"]
        assert len(starts) <= 1, starts
        return starts[0]["status"] if starts else None

    @property
    def headers(self) -> dict[str, str]:
        start = next(m for m in self.sent if m["type"] == "http.response.start")
        return {k.decode(): v.decode() for k, v in start["headers"]}

    @property
    def wire(self) -> bytes:
        return b"".join(m["body"] for m in self.sent if m["type"] == "http.response.body")

    @property
    def body(self) -> bytes:
        """The body as the client reads it: a gzip one decoded (zlib raises if it is not
        whole gzip), ended as a gzip member once the response is complete."""
        if self.status is None or self.headers.get("content-encoding") != "gzip":
            return self.wire
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        body = inflate.decompress(self.wire)
        assert inflate.eof == self.complete and not inflate.unused_data
        return body

    @property
    def complete(self) -> bool:
        bodies = [m for m in self.sent if m["type"] == "http.response.body"]
        return bool(bodies) and not bodies[-1]["more_body"]

    def events(self) -> list[dict[str, str]]:
        return parse_sse(self.body)

    def data_events(self) -> list[dict[str, str]]:
        return [e for e in self.events() if "data" in e]


def parse_sse(raw: bytes) -> list[dict[str, str]]:
    """Events (their fields) and comments (`{"comment": text}`), in order."""
    out: list[dict[str, str]] = []
    fields: dict[str, str] = {}
    for line in raw.decode().split("\n"):
        if not line:
            if fields:
                out.append(fields)
            fields = {}
        elif line.startswith(":"):
            out.append({"comment": line[1:].strip()})
        else:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
    assert not fields, f"an unterminated event at the end: {fields}"
    return out
