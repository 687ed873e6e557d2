"""Worker bootstrap: wires engine, metrics, core, servicer, health and reflection, and
shuts down in the written order (ARCHITECTURE.md): NOT_SERVING, drain, UNAVAILABLE for the
rest, the gRPC server, then the engine."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from model_service.config import ServerConfig, WorkerConfig
from model_service.core import WorkerCore
from model_service.engines import load_engine
from model_service.errors import Unavailable
from model_service.obs import tracing
from model_service.obs.metrics import WorkerMetrics
from model_service.rpc import reflection
from model_service.rpc.servicer import GenerationServicer, add_to_server
from sluice_common.contract import SERVICE_NAME
from sluice_common.gcpause import tune_gc

log = logging.getLogger("sluice.worker")

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
FINAL_FLUSH_S = 1.0


class Worker:
    """A worker process: one engine behind one gRPC server."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        tracing.setup(config.otlp_endpoint)
        self.engine = load_engine(config.engine)
        self.metrics = WorkerMetrics()
        self.core = WorkerCore(self.engine, config, self.metrics)
        self.metrics.watch(self.core.figures)
        self.server = grpc.aio.server(options=config.server.grpc_options())
        self.health = health.aio.HealthServicer()
        self.port = 0
        self.health_port = 0
        self.metrics_port = 0
        self.health_server: grpc.aio.Server | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._ready_task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.core.on_engine_dead = self._engine_dead
        add_to_server(GenerationServicer(self.core), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable((SERVICE_NAME, health.SERVICE_NAME), self.server)

    async def _set_health(self, status: int) -> None:
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def start(self) -> None:
        """Listen at once (NOT_SERVING), then load the engine and turn SERVING."""
        cfg = self.config.server
        address = f"{cfg.host}:{cfg.port}"
        creds = server_credentials(cfg)
        if creds is None:
            self.port = self.server.add_insecure_port(address)
        else:
            self.port = self.server.add_secure_port(address, creds)
        await self._set_health(NOT_SERVING)
        await self.server.start()
        if cfg.health_port is not None:
            self.health_server = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self.health_server)
            self.health_port = self.health_server.add_insecure_port(f"{cfg.host}:{cfg.health_port}")
            await self.health_server.start()
        if cfg.metrics_port is not None:
            self.metrics_port = self.metrics.serve(cfg.host, cfg.metrics_port)
        tls = "mTLS" if cfg.tls_client_ca else "TLS" if creds else "plaintext"
        log.info(
            "listening on %s:%d (%s; NOT_SERVING until the engine is ready)",
            cfg.host,
            self.port,
            tls,
            extra={
                "port": self.port,
                "health_port": self.health_port,
                "metrics_port": self.metrics_port,
            },
        )

    async def load_engine(self) -> None:
        await self.engine.start()
        await self.core.load_start_adapters()
        await self.core.open_gate()
        self.core.ready = True
        tune_gc()  # the engine's and the imports' objects: no collection scans them again
        await self._set_health(SERVING)
        info = self.engine.model_info
        log.info("engine %s ready: model %s, SERVING on port %d", info.engine, info.id, self.port)
        self._ready_task = asyncio.create_task(self.engine.watch_ready(self._engine_ready))

    async def _engine_ready(self, ready: bool) -> None:
        """The engine's own readiness changed (Triton went away or came back)."""
        if self.core.draining or (not ready and not self.core.ready):
            return
        self.core.ready = ready
        await self._set_health(SERVING if ready else NOT_SERVING)

    def _engine_dead(self) -> None:
        self._health_task = asyncio.create_task(self._set_health(NOT_SERVING))

    def request_stop(self) -> None:
        self._stop.set()

    async def wait_stop(self) -> None:
        await self._stop.wait()

    async def shutdown(self) -> None:
        """The written order (module docstring)."""
        self.core.draining = True
        # Queued generations have not reached the engine: refused now, the edge starts
        # them on another worker instead of their waiting out the grace here.
        self.core.admission.refuse_queued(Unavailable("worker is draining", retry_after_s=0.1))
        if self._ready_task is not None:
            self._ready_task.cancel()
        await self._set_health(NOT_SERVING)
        grace = self.config.server.drain_grace_s
        live = len(self.core.live)
        log.info("draining: %d generations in flight, grace %.1fs", live, grace)
        if not await self.core.wait_idle(grace):
            log.warning("drain grace over: ending %d generations", len(self.core.live))
            self.core.abort_all(
                Unavailable("worker shut down before the generation finished", retry_after_s=0.1)
            )
            await self.core.wait_idle(FINAL_FLUSH_S)
        await self.server.stop(FINAL_FLUSH_S)
        if self.health_server is not None:
            await self.health_server.stop(0)
        await self.core.close_gate()
        await self.engine.stop()
        tracing.shutdown()
        log.info("stopped")


def server_credentials(cfg: ServerConfig) -> grpc.ServerCredentials | None:
    """TLS (and mTLS with a client CA) credentials from PEM files, or None for plaintext."""
    if not cfg.tls_cert and not cfg.tls_key:
        if cfg.tls_client_ca:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if not (cfg.tls_cert and cfg.tls_key):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    key, cert = Path(cfg.tls_key).read_bytes(), Path(cfg.tls_cert).read_bytes()
    ca = Path(cfg.tls_client_ca).read_bytes() if cfg.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


def write_port_file(path: str, port: int) -> None:
    """Publish the bound port atomically (tests and scripts wait for this file)."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(str(port))
    os.replace(tmp, path)


async def serve(config: WorkerConfig, port_file: str = "") -> None:
    """Run a worker until SIGTERM/SIGINT, then shut it down in order."""
    worker = Worker(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.request_stop)
    await worker.start()
    if port_file:
        write_port_file(port_file, worker.port)
    loader = asyncio.create_task(worker.load_engine())
    stopper = asyncio.create_task(worker.wait_stop())
    done, _ = await asyncio.wait({loader, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if loader in done and loader.exception() is not None:
        stopper.cancel()
        await worker.server.stop(0)
        raise loader.exception()  # type: ignore[misc]
    await stopper
    if not loader.done():
        loader.cancel()
        await asyncio.gather(loader, return_exceptions=True)
    await worker.shutdown()
