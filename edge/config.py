"""The edge's configuration, declared once: nested sections (`EdgeConfig`) whose fields carry
their flag (`option(default, "--flag", "help")`); the parser and `config_from_args` are
made from those. `--processes N` passes it to each process as JSON (`$SLUICE_EDGE_CONFIG`).
Imports nothing from the edge's layers: they import it for their section."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import secrets
from dataclasses import dataclass, field
from typing import Any

from edge.checks import check
from sluice_common.options import add_section, option, section_from

ENV_VAR = "SLUICE_EDGE_CONFIG"
SECRET_ENV = "SLUICE_RESUME_SECRET"
ADMIN_KEY_ENV = "SLUICE_ADMIN_KEY"
CONTINUE_MODES = ("never", "sampled", "always")
# How a worker is chosen within a pool for a request without a session key
# (`edge.routing.scores`); a pool may set its own (`policy` in the pools file).
POLICIES = ("session", "cache_aware", "kv_aware", "least_load", "random")


@dataclass(slots=True)
class ServerConfig:
    host: str = option("127.0.0.1", "--host", "address to listen on")
    port: int = option(8000, "--port", "port (0 picks a free one)")
    port_file: str = option("", "--port-file", "write the bound port here once listening")
    processes: int = option(1, "--processes", "edge processes (uvicorn workers)")
    # Connections the kernel holds before the loop accepts them (capped by
    # net.core.somaxconn): a burst of thousands of new streams must not overflow it.
    backlog: int = option(8192, "--backlog", "pending connections to hold (listen backlog)")
    drain_grace_s: float = option(30.0, "--drain-grace", "seconds streams may finish on SIGTERM")
    # Kernel send buffer per client connection (SO_SNDBUF); 0 = the kernel's autotuning,
    # which lets each stalled SSE reader pin up to net.ipv4.tcp_wmem's maximum (often 4 MiB).
    socket_sndbuf: int = option(0, "--socket-sndbuf", "SO_SNDBUF per client socket (0: auto)")
    max_body_bytes: int = option(4 << 20, "--max-body-bytes", "largest request body")
    max_header_bytes: int = option(32 * 1024, "--max-header-bytes", "largest request head")
    max_headers: int = option(100, "--max-headers", "most header lines in a request")
    header_timeout_s: float = option(10.0, "--header-timeout", "s to send a request head")
    access_log: bool = option(False, "--access-log", "log every request", action="store_true")
    log_level: str = option("info", "--log-level", "log level")
    log_format: str = option("text", "--log-format", "text or json", choices=("text", "json"))
    # Tracing (edge/obs/tracing.py): on with an endpoint here or in OTEL_EXPORTER_OTLP_*.
    otlp_endpoint: str = option("", "--otlp-endpoint", "OTLP/gRPC endpoint for traces (on)")
    # Made by the parent of `--processes N` > 1: each process writes its metrics there
    # and /metrics merges them (`edge.obs.multiproc`).
    metrics_dir: str = ""


@dataclass(slots=True)
class StreamConfig:
    heartbeat_s: float = option(15.0, "--heartbeat", "SSE heartbeat after this idle time, s")
    first_byte_s: float = option(1.0, "--first-byte", "longest wait for the worker before the 200")
    request_timeout_s: float = option(600.0, "--request-timeout", "gRPC deadline per generation")
    retry_ms: int = option(3000, "--retry-ms", "SSE `retry:` hint for reconnecting clients")
    # Upstream bytes a worker may send ahead of a slow client, per stream (the HTTP/2
    # stream window of the worker channels): past it the worker merges new tokens into
    # fewer, larger messages until the client reads again.
    stream_buffer_bytes: int = option(
        256 * 1024, "--stream-buffer-bytes", "per-stream read-ahead from a worker, bytes"
    )
    # How long a worker keeps generating after an OpenAI-endpoint client left, so that a
    # retry with Last-Event-ID can pick it up live (StartGeneration.detach_grace_ms).
    # 0 = abort at once (frees the engine fastest); resume still works once it finished.
    detach_grace_s: float = option(
        0.0, "--openai-detach-grace", "s a worker runs on after an OpenAI client left (0: abort)"
    )
    # Browser streams (/v1/streams): how long the worker keeps generating with nobody
    # reading (between the POST and the GET, and across reconnects).
    stream_grace_s: float = option(
        30.0, "--stream-grace", "s a browser stream runs on with no reader (/v1/streams)"
    )
    stream_ttl_s: float = option(600.0, "--stream-ttl", "stream link lifetime, s")
    resume_secret_file: str = option(
        "", "--resume-secret-file", f"HMAC key file for event ids (else ${SECRET_ENV}, else random)"
    )
    # Gzip costs ~2 µs of CPU per event and saves ~300 bytes of it (edge.stream.gzip).
    sse_gzip: bool = option(
        True,
        "--sse-gzip",
        "gzip SSE streams for clients whose Accept-Encoding allows it",
        action=argparse.BooleanOptionalAction,
    )
    allow_stamps: bool = option(
        False, "--allow-stamps", "honour X-Sluice-Stamp-Times: 1 (benchmarks)", action="store_true"
    )
    # Resolved once by the parent process from resume_secret_file or $SLUICE_RESUME_SECRET
    # (hex), so every process and replica given the same secret signs the same ids.
    resume_secret: str = ""

    def commit_wait_s(self) -> float:
        """How long a stream waits for the worker's first answer before committing to 200."""
        return min(self.first_byte_s, self.heartbeat_s)


@dataclass(slots=True)
class RoutingConfig:
    workers: list[str] = option([], "--worker", "worker host:port (repeat)", action="append")
    pools_file: str = option("", "--pools", "pools file (JSON, or TOML by extension)")
    admin_key: str = option(
        "", "--admin-key", f"Bearer key of /admin and /metrics (default ${ADMIN_KEY_ENV})"
    )
    # How generations ride to workers: `session` (a few long-lived Session RPCs per
    # worker carry them all, one frame per engine step) or `simple` (one Generate RPC each).
    upstream: str = option(
        "session", "--upstream", "session or simple RPCs to workers", choices=("session", "simple")
    )
    sessions_per_worker: int = option(
        2, "--sessions-per-worker", "Session RPCs per worker (each filled to 256 before the next)"
    )
    max_tries: int = option(3, "--max-tries", "attempts per request, each on another worker")
    retry_budget_s: float = option(5.0, "--retry-budget", "seconds to find a replacement")
    continue_on_failure: str = option(
        "sampled", "--continue-on-failure", "continue mid-stream elsewhere", choices=CONTINUE_MODES
    )
    max_fails: int = option(1, "--max-fails", "passive failures that take a worker out (0: off)")
    fail_timeout_s: float = option(10.0, "--fail-timeout", "...within, and out for, seconds")
    # Each worker pushes its load (WatchLoad) when it changes, at most this often; the
    # edge adds its own calls since the last push. 0: no load stream (in-flight count only).
    load_interval_s: float = option(
        0.05, "--load-interval", "shortest gap between a worker's load pushes, s (0: off)"
    )
    policy: str = option(
        "session", "--routing-policy", "worker choice without a session key", choices=POLICIES
    )
    prefix_block_chars: int = option(
        1024, "--prefix-block-chars", "cache_aware: characters per prompt block in the index"
    )
    prefix_index_blocks: int = option(
        4096, "--prefix-index-blocks", "cache_aware: blocks held per worker of unknown KV size"
    )
    cache_load_weight: float = option(
        0.5, "--cache-load-weight", "cache_aware: weight of load against the expected hit"
    )
    cache_balance_abs: float = option(
        8.0, "--cache-balance-abs", "cache_aware: least loaded wins past this many more..."
    )
    cache_balance_rel: float = option(
        1.5, "--cache-balance-rel", "...and this factor more load than the least loaded"
    )
    # kv_aware takes the worker holding the longest prefix unless it carries more than
    # this many generations beyond the least loaded candidate (BENCHMARKS.md, issue 27).
    kv_load_slack: float = option(
        8.0, "--kv-load-slack", "kv_aware: extra load the longest prefix's holder may carry"
    )
    kv_index_blocks: int = option(
        262_144, "--kv-index-blocks", "kv_aware: most block hashes held per worker (oldest out)"
    )
    # A frozen or silently dead worker is found within keepalive + keepalive timeout:
    # its connection fails, its health Watch with it (out of rotation), and its calls end
    # UNAVAILABLE (retried elsewhere before the first token, continued or ended after).
    # LoRA adapters (`edge.routing.adapters`): requests name them as their model.
    loras: list[str] = option(
        [],
        "--lora",
        "adapter NAME=PATH (on the workers) that --lora-autoload may load (repeat)",
        action="append",
    )
    lora_autoload: bool = option(
        False,
        "--lora-autoload",
        "load a known adapter on a worker when a request names it and none holds it",
        action="store_true",
    )
    keepalive_s: float = option(2.0, "--keepalive", "gRPC keepalive ping interval, seconds")
    keepalive_timeout_s: float = option(
        2.0, "--keepalive-timeout", "seconds a worker has to answer a keepalive ping"
    )


@dataclass(slots=True)
class SessionConfig:
    """The sticky session (`edge.api.affinity`): a signed cookie for clients without a key,
    and how long a session keeps its pool (cookie lifetime = pinning store lifetime)."""

    cookie: str = option("sluice_session", "--session-cookie", "cookie name ('': issue none)")
    ttl_s: float = option(7200.0, "--session-ttl", "session lifetime, s (cookie and store)")
    domain: str = option("", "--session-cookie-domain", "cookie Domain ('': this host)")
    path: str = option("/", "--session-cookie-path", "cookie Path")
    secure: bool = option(
        False, "--session-cookie-secure", "mark the cookie Secure (HTTPS only)", action="store_true"
    )
    httponly: bool = option(
        True,
        "--session-cookie-httponly",
        "mark the cookie HttpOnly",
        action=argparse.BooleanOptionalAction,
    )
    samesite: str = option(
        "lax", "--session-cookie-samesite", "cookie SameSite", choices=("lax", "strict", "none")
    )
    store_max: int = option(
        1_000_000, "--session-store-max", "sessions the in-process store keeps at most"
    )


@dataclass(slots=True)
class SecurityConfig:
    api_keys_file: str = option(
        "", "--api-keys-file", "API keys, one per line (also $SLUICE_API_KEYS); none: auth off"
    )
    rate_limit_rps: float = option(0.0, "--rate-limit", "requests per second per key (0: off)")
    rate_limit_burst: int = option(0, "--rate-burst", "token bucket depth (0: the rate)")
    max_streams_per_key: int = option(0, "--max-streams-per-key", "generations in flight per key")
    tpm_limit: int = option(0, "--tpm-limit", "tokens per minute per key (0: off)")
    key_priorities: list[str] = option(
        [],
        "--key-priority",
        "NAME=high|normal|low: a key's priority class, its default and ceiling (repeat)",
        action="append",
    )
    # Budgets and tenants (`edge.security.budgets`, `edge.security.usage`): usage is
    # counted per key and per tenant (the key's name unless given here).
    key_budgets: list[str] = option(
        [],
        "--key-budget",
        "NAME=TOKENS/day|month: a key's token budget ('*': every other key; repeat)",
        action="append",
    )
    key_tenants: list[str] = option(
        [], "--key-tenant", "NAME=TENANT: a key's tenant (usage, fair share)", action="append"
    )
    max_prompt_chars: int = option(0, "--max-prompt-chars", "longest prompt, characters (0: off)")
    max_tools: int = option(128, "--max-tools", "most tools in one request (OpenAI's 128)")
    max_tools_chars: int = option(
        262_144, "--max-tools-chars", "characters of a request's tool definitions (0: off)"
    )
    max_arguments_chars: int = option(
        262_144, "--max-arguments-chars", "longest history tool-call arguments (0: off)"
    )
    chat_roles: list[str] = option(
        [],
        "--chat-role",
        "a chat role beyond OpenAI's five that the workers' template defines (repeat)",
        action="append",
    )
    cors_origins: list[str] = option(
        [], "--cors-origin", "browser origin allowed (repeat; '*': any)", action="append"
    )


@dataclass(slots=True)
class StoreConfig:
    """Where limits, session pins and stored responses live (`edge.store`): this process,
    or Redis shared by every process and replica."""

    url: str = option(
        "", "--store-url", "shared store, redis://host:port/db ('': this process only)"
    )
    failure: str = option(
        "open",
        "--store-failure",
        "when the shared store fails: open (local limits) or closed (503)",
        choices=("open", "closed"),
    )
    timeout_s: float = option(0.25, "--store-timeout", "longest wait for one store operation, s")
    prefix: str = option("sluice", "--store-prefix", "prefix of every key in the shared store")
    responses_ttl_s: float = option(
        86400.0, "--responses-ttl", "how long a stored response (store: true) is kept, s"
    )
    response_max_bytes: int = option(
        1 << 20,
        "--response-max-bytes",
        "largest stored response (its conversation and output, as JSON); a larger one is "
        "answered but not kept",
    )
    local_max_bytes: int = option(
        64 << 20,
        "--store-local-bytes",
        "stored responses this process keeps when it holds them itself (oldest out first)",
    )


@dataclass(slots=True)
class AuditConfig:
    """The audit log (`edge.obs.audit`): off unless a path is given."""

    path: str = option("", "--audit-log", "one JSON line per request to PATH ('-': stdout)")
    bodies: bool = option(
        False, "--audit-bodies", "add request and response bodies", action="store_true"
    )
    redact: list[str] = option(
        [],
        "--audit-redact",
        "/JSON/pointer (* any member) or a regex, redacted from bodies (repeat)",
        action="append",
    )
    max_bytes: int = option(100 << 20, "--audit-max-bytes", "rotate the file past this size")
    backups: int = option(5, "--audit-backups", "rotated files kept (PATH.1 ... PATH.N)")
    queue: int = option(10_000, "--audit-queue", "lines waiting for the writer; more: dropped")


@dataclass(slots=True)
class WorkerTLSConfig:
    """Any field set turns TLS on for every worker channel (`edge.security.tls`)."""

    ca: str = option("", "--worker-tls-ca", "PEM roots to verify workers (TLS on)")
    cert: str = option("", "--worker-tls-cert", "PEM client certificate (mTLS)")
    key: str = option("", "--worker-tls-key", "PEM key of --worker-tls-cert")
    server_name: str = option("", "--worker-tls-name", "name to verify in worker certificates")

    @property
    def enabled(self) -> bool:
        return bool(self.ca or self.cert or self.key or self.server_name)


@dataclass(slots=True)
class EdgeConfig:
    """Everything the edge needs (see the module docstring)."""

    server: ServerConfig = field(default_factory=ServerConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    session: SessionConfig = field(default_factory=SessionConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    worker_tls: WorkerTLSConfig = field(default_factory=WorkerTLSConfig)

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> EdgeConfig:
        return cls(**{name: section(**raw.get(name, {})) for name, section in SECTIONS.items()})

    @classmethod
    def from_env(cls) -> EdgeConfig:
        raw = os.environ.get(ENV_VAR)
        return cls.from_dict(json.loads(raw)) if raw else cls()


SECTIONS: dict[str, Any] = {
    "server": ServerConfig,
    "stream": StreamConfig,
    "routing": RoutingConfig,
    "session": SessionConfig,
    "security": SecurityConfig,
    "store": StoreConfig,
    "audit": AuditConfig,
    "worker_tls": WorkerTLSConfig,
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="edge", description="Sluice edge: OpenAI-compatible HTTP/SSE in front of gRPC workers."
    )
    for name, cls in SECTIONS.items():
        add_section(p.add_argument_group(name.replace("_", " ")), name, cls)
    return p


def config_from_args(args: argparse.Namespace) -> EdgeConfig:
    """The parsed flags as an EdgeConfig, checked (SystemExit with the reason)."""
    sections = {name: section_from(args, name, cls) for name, cls in SECTIONS.items()}
    config = EdgeConfig(**sections)
    check(config)
    if not config.routing.workers and not config.routing.pools_file:
        config.routing.workers = ["localhost:50051"]
    config.routing.admin_key = config.routing.admin_key or os.environ.get(ADMIN_KEY_ENV, "")
    config.stream.resume_secret = resume_secret(config.stream.resume_secret_file)
    return config


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
