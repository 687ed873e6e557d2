"""Upstream calls: `GenerateCall` (one simple-mode `Generate`) and `ResumeCall` (one
`Resume`), errors mapped; with `FailoverCall` they are `UpstreamCall`, all `edge.stream`
knows. Each message keeps its own index and the call names the worker and generation it
came from, so an event id says where it lives (nothing is renumbered)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

import grpc

from edge.errors import ApiError, from_rpc_error
from edge.upstream.continuation import split_id, whole_usage
from edge.upstream.worker import Worker
from generated import sluice_pb2 as pb
from sluice_common.contract import TRACE_KEY


class Sink(Protocol):
    """Where a call may hand its chunks straight from the upstream reader's task while the
    consumer is parked in `read(sink)`: no wake of the consumer per message. Finals,
    errors and every chunk `ready()` declines still come out of `read`, in order."""

    def ready(self) -> bool:
        """True if `take` may run now (nothing of the consumer's is in flight)."""
        ...

    def take(self, msg: pb.GenerateResponse) -> None:
        """Consume one chunk (synchronously). An exception fails the call with it."""
        ...


class UpstreamCall(Protocol):
    """One generation's upstream messages, gapless within each attempt, up to `final`."""

    @property
    def worker(self) -> Worker:
        """The worker the last message (or the current attempt) comes from."""
        ...

    @property
    def request_id(self) -> str:
        """The generation on `worker` that holds the last message read."""
        ...

    async def admitted(self) -> bool:
        """Wait until a worker accepted the generation; False if it ended already."""
        ...

    async def read(self, sink: Sink | None = None) -> pb.GenerateResponse:
        """The next message; raises `edge.errors.ApiError` for a failure. With `sink`, a
        call that can hands it chunks meanwhile (`Sink`); others ignore it."""
        ...

    async def settle(self, timeout_s: float) -> bool:
        """After `final`: True once the call ended OK."""
        ...

    def cancel(self) -> None:
        """End the call now (a no-op once it ended)."""
        ...


def _metadata(trace_id: str, traceparent: str = "") -> tuple[tuple[str, str], ...] | None:
    if traceparent:  # tracing on: the attempt's span is the worker's parent
        return ((TRACE_KEY, trace_id), ("traceparent", traceparent))
    return ((TRACE_KEY, trace_id),) if trace_id else None


class GenerateCall:
    """One simple-mode Generate RPC: send `start`, half-close, read until `final`.

    `read()` returns messages in order and raises ApiError for the RPC's failure status,
    a gap in the indices, or an end without `final`. `cancel()` ends the RPC at once (the
    worker then aborts the engine request).
    """

    def __init__(
        self,
        worker: Worker,
        start: pb.StartGeneration,
        timeout_s: float | None,
        trace_id: str = "",
        traceparent: str = "",
    ) -> None:
        self.worker = worker
        self.request_id = start.request_id
        self._call = worker.stub.Generate(
            timeout=timeout_s, metadata=_metadata(trace_id, traceparent)
        )
        self._start: pb.GenerateRequest | None = pb.GenerateRequest(start=start)
        self.next_index = 0

    async def admitted(self) -> bool:
        """Send the start and half-close, then wait for the response headers; False if the
        RPC already ended (a refusal).

        The worker sends them (`x-sluice-request-id`) once it accepted the generation,
        before the first token: the edge can then send its 200 at once. (Written here
        rather than from a request iterator: grpc would run a task per call to read it.)
        """
        try:
            if self._start is not None:
                request, self._start = self._start, None
                await self._call.write(request)
                await self._call.done_writing()
            await self._call.initial_metadata()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            return False
        return not self._call.done()

    async def read(self, sink: Sink | None = None) -> pb.GenerateResponse:
        try:
            msg = await self._call.read()
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err) from None
        if msg is grpc.aio.EOF:
            code = await self._call.code()
            if code != grpc.StatusCode.OK:  # pragma: no cover (read raises first)
                raise ApiError(502, f"upstream ended with {code.name}", type="server_error")
            raise ApiError(
                502,
                "upstream stream ended without a final message",
                type="server_error",
                code="upstream_error",
            )
        if msg.index != self.next_index:
            self.cancel()
            raise ApiError(
                502,
                f"upstream message {msg.index} arrived where {self.next_index} was due",
                type="server_error",
                code="upstream_error",
            )
        self.next_index += 1
        return msg

    async def settle(self, timeout_s: float) -> bool:
        """After `final`: wait for the RPC's status; True if it ended OK."""
        try:
            async with asyncio.timeout(timeout_s):
                return await self._call.code() == grpc.StatusCode.OK
        except TimeoutError:
            return False

    def cancel(self) -> None:
        """End the RPC now (a no-op once it ended)."""
        self._call.cancel()


class ResumeCall(GenerateCall):
    """A `Resume` RPC with GenerateCall's interface: the generation's messages from
    `from_index` on (replayed, then live). Its refusals are about the stream, not the
    request: an expired log is 410, an index past the end 400. A continuation's final
    usage is reported for the whole stream, as the live stream reported it."""

    def __init__(
        self,
        worker: Worker,
        request_id: str,
        from_index: int,
        timeout_s: float | None,
        trace_id: str = "",
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self.worker = worker
        self.request_id = request_id
        request = pb.ResumeRequest(request_id=request_id, from_index=from_index)
        self._call = worker.stub.Resume(request, timeout=timeout_s, metadata=_metadata(trace_id))
        self._start = None  # a unary request: sent by grpc itself
        self.next_index = from_index
        self._base_tokens = split_id(request_id)[1]  # a continuation's: tokens before it
        # Counted as a call on the worker, so removing the worker from its pool waits for
        # this stream instead of closing the channel under it.
        self._on_end = on_end
        self._held = True
        worker.in_flight += 1

    def cancel(self) -> None:
        """End the RPC (the response's `finally` always calls this once it is done)."""
        super().cancel()
        if self._held:
            self._held = False
            self.worker.in_flight -= 1
            if self._on_end is not None:
                self._on_end()

    async def read(self, sink: Sink | None = None) -> pb.GenerateResponse:
        try:
            msg = await super().read()
        except ApiError as err:
            if err.status == 404:
                raise ApiError(
                    410,
                    "this generation can no longer be resumed (its replay log expired)",
                    code="stream_expired",
                ) from None
            if err.code == "out_of_range":
                raise ApiError(
                    400,
                    "Last-Event-ID is past the end of the stream",
                    param="Last-Event-ID",
                    code="invalid_last_event_id",
                ) from None
            raise
        if self._base_tokens and msg.WhichOneof("kind") == "final":
            whole_usage(msg.final.usage, self._base_tokens)  # as the live stream said it
        return msg
