"""Edge configuration: one dataclass, filled from the CLI (and passed to worker processes
as JSON in an environment variable when `--processes` > 1)."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import secrets
from dataclasses import dataclass, field

from edge.pool_config import ROUTING_DEFAULTS as _R
from edge.pool_config import add_arguments as add_pool_arguments
from edge.pool_config import fields_from_args as pool_fields
from edge.security import add_arguments as add_security_arguments
from edge.security import fields_from_args as security_fields

ENV_VAR = "SLUICE_EDGE_CONFIG"
SECRET_ENV = "SLUICE_RESUME_SECRET"


@dataclass(slots=True)
class EdgeConfig:
    """Everything the edge needs."""

    workers: list[str] = field(default_factory=lambda: ["localhost:50051"])
    host: str = "127.0.0.1"
    port: int = 8000
    port_file: str = ""
    processes: int = 1  # uvicorn worker processes (`--processes`)
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
    # How long a worker keeps generating after an OpenAI-endpoint client left, so that a
    # retry with Last-Event-ID could pick it up (StartGeneration.detach_grace_ms).
    # 0 = abort at once (frees the engine fastest); resume still works once it finished.
    detach_grace_s: float = 0.0
    # Browser streams (/v1/streams): how long the worker keeps generating with nobody
    # reading (between the POST and the GET, and across reconnects).
    stream_grace_s: float = 30.0
    stream_ttl_s: float = 600.0  # lifetime of a stream link
    # HMAC key (hex) for event ids and stream links; replicas must share it to resume each
    # other's streams. Empty: SLUICE_RESUME_SECRET, else a random one per edge instance.
    resume_secret: str = ""
    # Pools and routing (`edge/pool_config.py`): a pools file besides `--worker` flags, the
    # admin API key (empty: admin API off), failover, passive health, load polling.
    pools_file: str = ""
    admin_key: str = ""
    max_tries: int = _R.max_tries
    retry_budget_s: float = _R.retry_budget_s
    continue_on_failure: str = _R.continue_on_failure
    max_fails: int = _R.max_fails
    fail_timeout_s: float = _R.fail_timeout_s
    stats_interval_s: float = _R.stats_interval_s
    access_log: bool = False
    log_level: str = "info"
    # Security and limits (`edge/security.py` has the flags; README "Security and limits").
    api_keys: list[str] = field(default_factory=list)  # "name:sha256 hex": never a key
    rate_limit_rps: float = 0.0  # per key; 0 = off
    rate_limit_burst: int = 0  # 0 = the rate (at least 1)
    max_streams_per_key: int = 0  # generations in flight per key; 0 = no limit
    max_prompt_chars: int = 0  # 0 = no limit (the body is still bounded by max_body_bytes)
    cors_origins: list[str] = field(default_factory=list)
    worker_tls_ca: str = ""  # any worker_tls_* set: TLS to workers (edge/tls.py)
    worker_tls_cert: str = ""
    worker_tls_key: str = ""
    worker_tls_name: str = ""
    log_format: str = "text"  # or "json" (with one access record per request)
    allow_stamps: bool = False  # honour X-Sluice-Stamp-Times (benchmarks)

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
        "--processes", type=int, default=d.processes, help="edge processes (uvicorn workers)"
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
    p.add_argument(
        "--stream-grace",
        type=float,
        default=d.stream_grace_s,
        help="seconds a browser stream runs on with no reader (/v1/streams)",
    )
    p.add_argument("--stream-ttl", type=float, default=d.stream_ttl_s, help="stream link lifetime")
    p.add_argument(
        "--resume-secret-file",
        default="",
        help="file holding the HMAC key for event ids (else $SLUICE_RESUME_SECRET, else random)",
    )
    add_pool_arguments(p)
    add_security_arguments(p)
    p.add_argument("--access-log", action="store_true")
    p.add_argument("--log-level", default=d.log_level)
    return p


def config_from_args(args: argparse.Namespace) -> EdgeConfig:
    if args.heartbeat <= 0 or args.request_timeout <= 0 or args.processes < 1:
        raise SystemExit("--heartbeat and --request-timeout must be positive, --processes at least 1")
    return EdgeConfig(
        workers=args.worker or ([] if args.pools else EdgeConfig().workers),
        host=args.host,
        port=args.port,
        port_file=args.port_file,
        processes=args.processes,
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
        stream_grace_s=args.stream_grace,
        stream_ttl_s=args.stream_ttl,
        resume_secret=resume_secret(args.resume_secret_file),
        **pool_fields(args),
        **security_fields(args),
        access_log=args.access_log,
        log_level=args.log_level,
    )


def resume_secret(path: str) -> str:
    """The resume HMAC key as hex: from a file, the environment, or fresh (one instance).

    Resolved once in the parent process, so `--processes N` processes share it.
    """
    raw = ""
    if path:
        with open(path) as f:
            raw = f.read().strip()
    raw = raw or os.environ.get(SECRET_ENV, "")
    if raw:
        return hashlib.sha256(raw.encode()).hexdigest()
    return secrets.token_hex(32)
