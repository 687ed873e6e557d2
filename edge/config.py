"""Edge configuration: one dataclass, filled from the CLI (and passed to worker processes
as JSON in an environment variable when `--workers` > 1)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass, field

ENV_VAR = "SLUICE_EDGE_CONFIG"


@dataclass(slots=True)
class EdgeConfig:
    """Everything the edge needs."""

    workers: list[str] = field(default_factory=lambda: ["localhost:50051"])
    host: str = "127.0.0.1"
    port: int = 8000
    port_file: str = ""
    processes: int = 1  # uvicorn worker processes (`--workers`)
    heartbeat_s: float = 15.0  # SSE comment while no event was sent for this long
    first_byte_s: float = 1.0  # longest wait for the worker before sending the 200
    request_timeout_s: float = 600.0  # gRPC deadline of one generation
    retry_ms: int = 3000  # SSE `retry:` hint for reconnecting clients
    stream_buffer_bytes: int = 256 * 1024  # pending text per stream before upstream is paused
    max_body_bytes: int = 4 * 1024 * 1024
    # Kernel send buffer per client connection (SO_SNDBUF); 0 = the kernel's autotuning,
    # which lets each stalled SSE reader pin up to net.ipv4.tcp_wmem's maximum (often 4 MiB).
    socket_sndbuf: int = 0
    keepalive_s: float = 30.0  # gRPC keepalive ping interval to workers
    drain_grace_s: float = 30.0  # on SIGTERM: how long in-flight streams may finish
    # How long a worker keeps generating after the client left, so that a resume could pick
    # it up (StartGeneration.detach_grace_ms). The edge does not resume yet: 0, abort at once.
    detach_grace_s: float = 0.0
    access_log: bool = False
    log_level: str = "info"

    def commit_wait_s(self) -> float:
        """How long a stream waits for the worker's first answer before committing to 200."""
        return min(self.first_byte_s, self.heartbeat_s)

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls) -> EdgeConfig:
        raw = os.environ.get(ENV_VAR)
        return cls(**json.loads(raw)) if raw else cls()


def build_parser() -> argparse.ArgumentParser:
    d = EdgeConfig()
    p = argparse.ArgumentParser(
        prog="edge", description="Sluice edge: OpenAI-compatible HTTP/SSE in front of gRPC workers."
    )
    p.add_argument(
        "--worker", action="append", default=[], help="worker host:port (repeat for several)"
    )
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port, help="0 picks a free port")
    p.add_argument("--port-file", default="", help="write the bound port here once listening")
    p.add_argument(
        "--workers", type=int, default=d.processes, help="edge processes (uvicorn workers)"
    )
    p.add_argument(
        "--heartbeat", type=float, default=d.heartbeat_s, help="SSE heartbeat interval, seconds"
    )
    p.add_argument(
        "--first-byte",
        type=float,
        default=d.first_byte_s,
        help="longest wait for the worker before the 200 is sent, seconds",
    )
    p.add_argument(
        "--request-timeout", type=float, default=d.request_timeout_s, help="seconds per generation"
    )
    p.add_argument("--retry-ms", type=int, default=d.retry_ms, help="SSE retry hint")
    p.add_argument("--stream-buffer-bytes", type=int, default=d.stream_buffer_bytes)
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument(
        "--socket-sndbuf",
        type=int,
        default=d.socket_sndbuf,
        help="kernel send buffer per client connection, bytes (0: autotuned)",
    )
    p.add_argument("--keepalive", type=float, default=d.keepalive_s, help="gRPC keepalive, seconds")
    p.add_argument("--drain-grace", type=float, default=d.drain_grace_s, help="seconds")
    p.add_argument(
        "--detach-grace",
        type=float,
        default=d.detach_grace_s,
        help="seconds a worker keeps generating after the client left (0: abort at once)",
    )
    p.add_argument("--access-log", action="store_true")
    p.add_argument("--log-level", default=d.log_level)
    return p


def config_from_args(args: argparse.Namespace) -> EdgeConfig:
    if args.heartbeat <= 0 or args.request_timeout <= 0 or args.workers < 1:
        raise SystemExit("--heartbeat and --request-timeout must be positive, --workers at least 1")
    return EdgeConfig(
        workers=args.worker or EdgeConfig().workers,
        host=args.host,
        port=args.port,
        port_file=args.port_file,
        processes=args.workers,
        heartbeat_s=args.heartbeat,
        first_byte_s=args.first_byte,
        request_timeout_s=args.request_timeout,
        retry_ms=args.retry_ms,
        stream_buffer_bytes=args.stream_buffer_bytes,
        max_body_bytes=args.max_body_bytes,
        socket_sndbuf=args.socket_sndbuf,
        keepalive_s=args.keepalive,
        drain_grace_s=args.drain_grace,
        detach_grace_s=args.detach_grace,
        access_log=args.access_log,
        log_level=args.log_level,
    )
