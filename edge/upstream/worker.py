"""A worker as the edge sees it: one shared `grpc.aio` channel, its health `Watch`, its load
pushes (`WatchLoad`) plus this edge's calls since (`load`), and passive failure marking
(nginx's `max_fails`/`fail_timeout`, cleared when the Watch turns SERVING again). `epoch`
counts the times it turned SERVING: a restarted worker has lost its prefix cache. `cache`
follows its prefix cache's events for `kv_aware` pools (`cachefeed.py`)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import time
from collections import deque

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edge.config import RoutingConfig
from edge.errors import ApiError, from_rpc_error
from edge.upstream.cachefeed import CacheFeed
from edge.upstream.channel import ChannelFactory
from edge.upstream.session import SessionPool
from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from sluice_common.contract import SERVICE_NAME

log = logging.getLogger("sluice.edge")

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
UNKNOWN = health_pb2.HealthCheckResponse.UNKNOWN
UNREACHABLE = -1  # ours: the watch stream itself failed
WATCH_BACKOFF_S = (0.05, 2.0)  # first and longest wait between Watch attempts
LIST_MODELS_TIMEOUT_S = 5.0
ADAPTER_TIMEOUT_S = 60.0  # a load reads the adapter's weights
LOAD_HEARTBEAT_S = 1.0  # the longest gap between load pushes we ask for
Metadata = tuple[tuple[str, str], ...] | None  # a call's invocation metadata


def worker_key(address: str) -> str:
    """A short, stable, opaque name for a worker address (in event ids and headers, so
    internal addresses never reach clients)."""
    digest = hashlib.sha256(address.encode()).digest()[:6]
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


class PassiveHealth:
    """Failure marking from real requests (see module docstring). Pure, clock passed in."""

    def __init__(self, max_fails: int, fail_timeout_s: float) -> None:
        self.max_fails = max_fails
        self.fail_timeout_s = fail_timeout_s
        self.down_until = 0.0
        self._fails: deque[float] = deque()

    def failure(self, now: float) -> bool:
        """Count one failure; True when it takes the worker out now."""
        if self.max_fails <= 0:
            return False
        self._fails.append(now)
        while self._fails and self._fails[0] <= now - self.fail_timeout_s:
            self._fails.popleft()
        if len(self._fails) >= self.max_fails:
            self._fails.clear()
            self.down_until = now + self.fail_timeout_s
            return True
        return False

    def available(self, now: float) -> bool:
        return now >= self.down_until

    def recent(self, now: float) -> int:
        return sum(1 for t in self._fails if t > now - self.fail_timeout_s)

    def reset(self) -> None:
        self._fails.clear()
        self.down_until = 0.0


class Worker:
    """One model worker in a pool: channel, stub, health, routing state (module docstring)."""

    def __init__(
        self, address: str, pool: str, channels: ChannelFactory, opts: RoutingConfig
    ) -> None:
        self.address = address
        self.key = worker_key(address)
        self.pool = pool
        self.in_flight = 0  # this edge's calls on the worker now
        self.channel = channels.open(address)
        self.stub = pb_grpc.GenerationStub(self.channel)
        self.sessions = SessionPool(self, opts.sessions_per_worker, channels.stream_window_bytes)
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self.status: int = UNKNOWN
        self.models: list[pb.ModelInfo] = []
        self.removed = False  # out of its pool; kept open only while calls finish
        self.closed = False  # its channel is closed: no call can start on it
        self.passive = PassiveHealth(opts.max_fails, opts.fail_timeout_s)
        self.reported_draining = False
        self.reported: pb.WorkerLoad | None = None  # the last load push (other edges' too)
        self._reported_load = -1  # its running + waiting; -1: no push to go by
        self._in_flight_at_report = 0  # this edge's in-flight count when it arrived
        self.epoch = 0  # times it turned SERVING (module docstring)
        self.models_version = -1  # the worker's count of adapter changes we listed after
        self._relisting: asyncio.Task[None] | None = None  # ListModels after a new version
        self._serving = asyncio.Event()
        self.heard = asyncio.Event()  # its health watch answered or failed once
        self._load_interval = opts.load_interval_s
        self._tasks: list[asyncio.Task[None]] = []
        self.cache = CacheFeed(self.key, self.stub, opts.kv_index_blocks)

    # -- state ------------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        return self.status == SERVING and not self.reported_draining

    def routable(self, now: float | None = None) -> bool:
        """May get a new generation now."""
        t = time.monotonic() if now is None else now
        return self.serving and not self.removed and self.passive.available(t)

    @property
    def load(self) -> int:
        """Generations on the worker now, as this edge best knows (module docstring)."""
        if self._reported_load < 0:
            return self.in_flight
        since = self.in_flight - self._in_flight_at_report
        return max(self.in_flight, self._reported_load + since)

    def kv_cache_tokens(self) -> int:
        """The worker's KV cache size in tokens, once it reported one (else 0)."""
        return self.reported.kv_cache_tokens if self.reported is not None else 0

    def model_id(self) -> str:
        """The worker's model name, once known (the contract serves one model per worker)."""
        return self.models[0].id if self.models else ""

    def version(self) -> str:
        """The version label the worker itself reports (ListModels), "" until known."""
        return self.models[0].version if self.models else ""

    # -- LoRA adapters (`edge.routing.adapters`) ---------------------------------------

    def holds(self, model: str) -> bool:
        """It lists `model` (its base model or a loaded adapter)."""
        return any(m.id == model for m in self.models)

    def adapter_room(self) -> int:
        """Adapter slots free, as last listed (0 until listed)."""
        if not self.models:
            return 0
        return max(0, self.models[0].max_adapters - sum(1 for m in self.models if m.parent))

    def warm(self, adapter: str) -> bool:
        """`adapter` has generations here now, and a batch slot is free for one more."""
        r = self.reported
        return r is not None and adapter in r.active_adapters and self.load < r.max_running

    async def load_adapter(self, name: str, path: str) -> pb.ModelInfo:
        """LoadAdapter, then the models listed again. Raises ApiError."""
        try:
            info = await self.stub.LoadAdapter(
                pb.LoadAdapterRequest(name=name, path=path), timeout=ADAPTER_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as err:
            raise adapter_error(err) from None
        await self._load_models()
        return info

    async def unload_adapter(self, name: str) -> None:
        """UnloadAdapter, then the models listed again. Raises ApiError."""
        try:
            await self.stub.UnloadAdapter(
                pb.UnloadAdapterRequest(name=name), timeout=LIST_MODELS_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as err:
            raise adapter_error(err) from None
        await self._load_models()

    def failed(self, now: float | None = None) -> None:
        """A request on this worker failed the way a dead or broken worker fails."""
        if self.passive.failure(time.monotonic() if now is None else now):
            log.warning(
                "worker %s out of rotation for %.1fs after %d failure(s)",
                self.address,
                self.passive.fail_timeout_s,
                self.passive.max_fails,
            )

    def _set_status(self, status: int) -> None:
        if status == self.status:
            return
        log.info("worker %s: %s", self.address, status_name(status))
        if status == SERVING:
            self.passive.reset()  # a fresh start (or a recovered one) gets a clean slate
            self.reported_draining = False
            self.epoch += 1
            self._serving.set()
        else:
            self.models = []  # reloaded when it serves again: it may be a new version
            self._serving.clear()
        self.status = status

    # -- life -------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._watch(), name=f"health {self.address}"))
        if self._load_interval > 0:
            self._tasks.append(asyncio.create_task(self._watch_load(), name=f"load {self.address}"))

    def follow_cache(self) -> None:
        """Follow the worker's prefix-cache events from now on (a `kv_aware` pool's)."""
        self.cache.follow(lambda: self._serving)

    async def close(self) -> None:
        self.closed = True
        if self._relisting is not None:
            self._relisting.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.cache.close()
        await self.sessions.close()
        await self.channel.close(grace=None)

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
                    self.heard.set()
                self._set_status(UNREACHABLE)  # the worker ended the watch (shutting down)
            except grpc.aio.AioRpcError as err:
                self._set_status(UNREACHABLE)
                log.debug("health watch of %s failed: %s", self.address, err.code().name)
            self.heard.set()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, WATCH_BACKOFF_S[1])

    async def _load_models(self) -> None:
        try:
            resp = await self.stub.ListModels(pb.ListModelsRequest(), timeout=LIST_MODELS_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            log.warning("ListModels on %s failed: %s", self.address, err.code().name)
            return
        self.models = list(resp.models)

    async def _relist(self) -> None:
        try:
            await self._load_models()
        finally:
            self._relisting = None

    async def list_models(self) -> list[pb.ModelInfo]:
        """Ask the worker now (also refreshes the cache). Raises ApiError."""
        try:
            resp = await self.stub.ListModels(pb.ListModelsRequest(), timeout=LIST_MODELS_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err) from None
        self.models = list(resp.models)
        return self.models

    async def tokenize(self, request: pb.TokenizeRequest) -> list[int]:
        """The worker's token ids for an input, chat template applied. Raises ApiError."""
        try:
            resp = await self.stub.Tokenize(request, timeout=LIST_MODELS_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err) from None
        return list(resp.token_ids)

    async def embed(
        self, request: pb.EmbedRequest, timeout_s: float, metadata: Metadata = None
    ) -> pb.EmbedResponse:
        """The worker's `Embed`, counted in its in-flight calls. Raises AioRpcError."""
        self.in_flight += 1
        try:
            return await self.stub.Embed(request, timeout=timeout_s, metadata=metadata)
        finally:
            self.in_flight -= 1

    async def _watch_load(self) -> None:
        """Follow the worker's load pushes while it serves (module docstring)."""
        interval_ms = max(1, round(self._load_interval * 1000))
        request = pb.WatchLoadRequest(
            min_interval_ms=interval_ms,
            max_interval_ms=max(interval_ms, round(LOAD_HEARTBEAT_S * 1000)),
        )
        backoff = WATCH_BACKOFF_S[0]
        while True:
            await self._serving.wait()
            try:
                async for msg in self.stub.WatchLoad(request):
                    backoff = WATCH_BACKOFF_S[0]
                    self.loaded(msg)
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    log.info("worker %s pushes no load: routing by in-flight count", self.address)
                    self.loaded(None)
                    return
                log.debug("load watch of %s failed: %s", self.address, err.code().name)
            self.loaded(None)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, WATCH_BACKOFF_S[1])

    def loaded(self, msg: pb.WorkerLoad | None) -> None:
        """A load push arrived (None: the stream ended, nothing to go by)."""
        self.reported = msg
        if msg is not None and msg.models_version != self.models_version:
            # Adapters came or went (through any edge): list the models again.
            self.models_version = msg.models_version
            if self.models and self.status == SERVING and self._relisting is None:
                self._relisting = asyncio.create_task(self._relist(), name=f"models {self.address}")
        self._in_flight_at_report = self.in_flight
        self._reported_load = msg.running + msg.waiting if msg is not None else -1
        self.reported_draining = msg.draining if msg is not None else False

    def describe(self, now: float | None = None) -> dict[str, object]:
        """For the admin API."""
        t = time.monotonic() if now is None else now
        return {
            "id": self.key,
            "address": self.address,
            "status": status_name(self.status),
            "routable": self.routable(t),
            "in_flight": self.in_flight,
            "load": self.load,
            "reported": _load_dict(self.reported),
            "recent_failures": self.passive.recent(t),
            "out_for_s": round(max(0.0, self.passive.down_until - t), 3),
            "model": self.model_id(),
            "version": self.version(),
            "kv_cache": self.cache.describe(),
        }


def _load_dict(msg: pb.WorkerLoad | None) -> dict[str, object] | None:
    if msg is None:
        return None
    return {
        "running": msg.running,
        "waiting": msg.waiting,
        "max_running": msg.max_running,
        "kv_cache_usage": round(msg.kv_cache_usage, 4),
        "prefix_cache_hit_rate": round(msg.prefix_cache_hit_rate, 4),
        "tokens_per_s": round(msg.tokens_per_s, 1),
        "kv_cache_tokens": msg.kv_cache_tokens,
    }


def status_name(status: int) -> str:
    if status == UNREACHABLE:
        return "UNREACHABLE"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(status)  # type: ignore[arg-type]


def adapter_error(err: grpc.aio.AioRpcError) -> ApiError:
    """A LoadAdapter / UnloadAdapter failure: the status table's, with the adapter codes."""
    api = from_rpc_error(err)
    code = err.code()
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:  # out of slots: waiting does not help
        return ApiError(409, api.message, param="name", code="adapter_slots_full")
    if code == grpc.StatusCode.NOT_FOUND:
        return ApiError(404, api.message, type="not_found_error", code="adapter_not_found")
    if code == grpc.StatusCode.ALREADY_EXISTS:
        return ApiError(409, api.message, param="name", code="adapter_exists")
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return ApiError(409, api.message, code="adapters_off")
    return api


async def first_word(workers: list[Worker], timeout_s: float) -> None:
    """Until each worker's health watch has answered or failed once, at most `timeout_s`:
    a process then accepts requests knowing which workers serve (with `--processes N`,
    /readyz answered at startup by one process says nothing of the others)."""
    try:
        async with asyncio.timeout(timeout_s):
            for w in workers:
                await w.heard.wait()
    except TimeoutError:
        unheard = [w.address for w in workers if not w.heard.is_set()]
        log.warning(
            "not heard from %s %g s into startup; serving anyway",
            ", ".join(unheard),
            timeout_s,
        )
