"""CLI: `python -m edge --worker localhost:50051 --port 8000` (console script `sluice-edge`).

Shuts down in the order ARCHITECTURE.md writes out (draining, the grace, uvicorn stops
accepting, the lifespan closes); a second SIGINT (Ctrl-C) stops at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import logging.config
import os
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path
from types import FrameType

import uvicorn
from uvicorn.supervisors import Multiprocess

from edge.api.state import EdgeState
from edge.app import create_app
from edge.config import ENV_VAR, EdgeConfig, build_parser, config_from_args
from edge.obs.logs import log_config
from edge.routing.pools import PoolConfigError, build_pools
from edge.security import tls
from edge.security.auth import KeyFileError, load_keys
from edge.security.cors import check_origins
from edge.security.http_limits import LimitedConfig
from sluice_common.gcpause import tune_gc

log = logging.getLogger("sluice.edge")

# After the drain: how long uvicorn waits for what is still running before cancelling it.
FINAL_GRACE_S = 1


class EdgeServer(uvicorn.Server):
    """uvicorn's server, plus: the port file once listening, /readyz 503 while draining."""

    def __init__(
        self, config: uvicorn.Config, edge: EdgeConfig, state: EdgeState, port: int
    ) -> None:
        super().__init__(config)
        self.edge = edge
        self.state = state
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drainer: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self._loop = asyncio.get_running_loop()
        tune_gc()
        if self.started and self.edge.server.port_file:
            write_port_file(self.edge.server.port_file, self.port)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Drain (ARCHITECTURE.md's shutdown order). Unlike uvicorn's own, the signal is not raised
        again after the drain: a graceful stop exits 0."""
        if self.state.draining or self._loop is None:  # again, or before start-up ended
            if sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop waiting for streams
            self.should_exit = True
            return
        self.state.draining = True
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drainer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        """Until the streams end or the grace is over, then uvicorn's own shutdown."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                self.state.metrics.no_streams.wait(), self.edge.server.drain_grace_s
            )
        self.should_exit = True


def write_port_file(path: str, port: int) -> None:
    tmp = Path(f"{path}.tmp")
    tmp.write_text(str(port))
    os.replace(tmp, path)


def bind(host: str, port: int, sndbuf: int = 0, backlog: int = 2048) -> socket.socket:
    """Bind before uvicorn starts, so port 0 is known and worker processes can share it.
    Accepted connections inherit the listening socket's SO_SNDBUF."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if sndbuf > 0:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def uvicorn_config(app: object, edge: EdgeConfig, **extra: object) -> uvicorn.Config:
    s = edge.server
    # One process drains in EdgeServer first; uvicorn's processes (--processes N) run
    # uvicorn's own server, whose graceful shutdown is then the drain.
    grace = FINAL_GRACE_S if s.processes == 1 else int(s.drain_grace_s) or 1
    return LimitedConfig(  # httptools, with bounds on request heads
        app,
        s,
        loop="uvloop",
        lifespan="on",
        access_log=s.access_log and s.log_format != "json",  # JSON: edge.obs has its own
        log_config=log_config(s.log_format, s.log_level),  # applied in every process
        log_level=s.log_level,
        timeout_graceful_shutdown=grace,
        **extra,  # type: ignore[arg-type]
    )


def check_files(edge: EdgeConfig) -> None:
    """What the layers will read at startup, read once now: a mistake stops the command
    line with its reason instead of every process at startup."""
    try:
        load_keys(edge.security.api_keys_file)
        check_origins(edge.security.cors_origins)
        tls.check(edge.worker_tls)
        build_pools(edge.routing.pools_file, edge.routing.workers)
    except (KeyFileError, PoolConfigError, OSError, ValueError) as err:
        raise SystemExit(str(err)) from None


def main(argv: list[str] | None = None) -> int:
    edge = config_from_args(build_parser().parse_args(argv))
    check_files(edge)
    s = edge.server
    logging.config.dictConfig(log_config(s.log_format, s.log_level))
    sock = bind(s.host, s.port, s.socket_sndbuf, s.backlog)
    port = sock.getsockname()[1]
    if s.processes > 1:
        # Each process builds its own app (own channels, own metrics) from the environment;
        # their metrics meet in one directory, which /metrics in any of them merges.
        edge.server.metrics_dir = tempfile.mkdtemp(prefix="sluice-edge-metrics-")
        os.environ[ENV_VAR] = edge.to_env()
        config = uvicorn_config("edge.app:app_from_env", edge, factory=True, workers=s.processes)
        if s.port_file:
            write_port_file(s.port_file, port)  # the listening socket queues until they accept
        try:
            Multiprocess(config, sockets=[sock]).run()
        finally:
            shutil.rmtree(edge.server.metrics_dir, ignore_errors=True)
        return 0
    state = EdgeState(edge)
    server = EdgeServer(uvicorn_config(create_app(edge, state), edge), edge, state, port)
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
