"""Model workers as the edge sees them: one long-lived gRPC channel each, health, routing.

A `Worker` owns one `grpc.aio` channel shared by every request to it (never a channel per
request) and a health watcher (grpc.health.v1 `Watch`) that keeps its status current.
Routing among workers lives in `edge.pools` / `edge.routing`. `GenerateCall` is one simple-
mode `Generate` RPC (one `start`, read until `final`) with errors already mapped by
`edge.errors`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edge import tls
from edge.errors import ApiError, from_rpc_error
from edge.resume import worker_key
from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc

log = logging.getLogger("sluice.edge")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Generation"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
UNKNOWN = health_pb2.HealthCheckResponse.UNKNOWN
UNREACHABLE = -1  # ours: the watch stream itself failed
WATCH_BACKOFF_S = (0.05, 2.0)  # first and longest wait between Watch attempts
LIST_MODELS_TIMEOUT_S = 5.0
TRACE_KEY = "x-request-id"  # gRPC metadata: the worker logs it with the generation


def channel_options(
    keepalive_s: float = 30.0, max_message_bytes: int = 8 << 20
) -> list[tuple[str, int]]:
    """Keepalive catches a silently dead worker; short reconnect backoff finds a restarted one."""
    return [
        ("grpc.keepalive_time_ms", int(keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2_000),
    ]


class Worker:
    """One model worker: channel, stubs, health status, served models."""

    def __init__(self, address: str, options: Sequence[tuple[str, int]]) -> None:
        self.address = address
        self.key = worker_key(address)
        self.in_flight = 0  # this edge's calls on the worker now
        self.channel = tls.open_channel(address, options)  # TLS when configured (edge.tls)
        self.stub = pb_grpc.GenerationStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self.status: int = UNKNOWN
        self.models: list[pb.ModelInfo] = []
        self._watcher: asyncio.Task[None] | None = None

    @property
    def serving(self) -> bool:
        return self.status == SERVING

    def start(self) -> None:
        self._watcher = asyncio.create_task(self._watch(), name=f"health-watch {self.address}")

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        await self.channel.close(grace=None)

    def _set_status(self, status: int) -> None:
        if status != self.status:
            log.info("worker %s: %s", self.address, _status_name(status))
            self.status = status
            if status != SERVING:
                self.models = []  # reloaded when it serves again: it may be a new version

    async def _watch(self) -> None:
        """Follow the worker's health forever; reconnect with backoff when the stream breaks."""
        backoff = WATCH_BACKOFF_S[0]
        request = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
        while True:
            try:
                async for resp in self._health.Watch(request):
                    backoff = WATCH_BACKOFF_S[0]
                    if resp.status == SERVING and not self.models:
                        await self._load_models()
                    self._set_status(resp.status)
                self._set_status(UNREACHABLE)  # the worker ended the watch (shutting down)
            except grpc.aio.AioRpcError as err:
                self._set_status(UNREACHABLE)
                log.debug("health watch of %s failed: %s", self.address, err.code().name)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, WATCH_BACKOFF_S[1])

    async def _load_models(self) -> None:
        try:
            resp = await self.stub.ListModels(pb.ListModelsRequest(), timeout=LIST_MODELS_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            log.warning("ListModels on %s failed: %s", self.address, err.code().name)
            return
        self.models = list(resp.models)

    async def list_models(self) -> list[pb.ModelInfo]:
        """Ask the worker now (also refreshes the cache). Raises ApiError."""
        try:
            resp = await self.stub.ListModels(pb.ListModelsRequest(), timeout=LIST_MODELS_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err) from None
        self.models = list(resp.models)
        return self.models

    def model_id(self) -> str:
        """The worker's model name, once known (the contract serves one model per worker)."""
        return self.models[0].id if self.models else ""


def _status_name(status: int) -> str:
    if status == UNREACHABLE:
        return "UNREACHABLE"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(status)  # type: ignore[arg-type]


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
    ) -> None:
        self.worker = worker
        metadata = ((TRACE_KEY, trace_id),) if trace_id else None
        # A one-item request iterator: grpc sends it and half-closes on its own.
        self._call = worker.stub.Generate(
            iter((pb.GenerateRequest(start=start),)), timeout=timeout_s, metadata=metadata
        )
        self._next_index = 0

    async def admitted(self) -> bool:
        """Wait for the response headers; False if the RPC already ended (a refusal).

        The worker sends them (`x-sluice-request-id`) once it accepted the generation,
        before the first token: the edge can then send its 200 at once.
        """
        try:
            await self._call.initial_metadata()
        except grpc.aio.AioRpcError:
            return False
        return not self._call.done()

    async def read(self) -> pb.GenerateResponse:
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
        if msg.index != self._next_index:
            self.cancel()
            raise ApiError(
                502,
                f"upstream message {msg.index} arrived where {self._next_index} was due",
                type="server_error",
                code="upstream_error",
            )
        self._next_index += 1
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
    request: an expired log is 410, an index past the end 400."""

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
        metadata = ((TRACE_KEY, trace_id),) if trace_id else None
        request = pb.ResumeRequest(request_id=request_id, from_index=from_index)
        self._call = worker.stub.Resume(request, timeout=timeout_s, metadata=metadata)
        self._next_index = from_index
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

    async def read(self) -> pb.GenerateResponse:
        try:
            return await super().read()
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
