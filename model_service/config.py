"""Worker configuration: one dataclass per concern, filled from the CLI."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from sluice_common import otel

LOOPS = ("auto", "asyncio", "uvloop")


@dataclass(slots=True)
class SimOptions:
    """The simulated engine: a continuous-batching LLM stand-in for tests and benchmarks."""

    ttft_s: float = 0.02  # prefill time before the first token
    token_delay_s: float = 0.005  # decode time per token (0 = as fast as possible)
    startup_s: float = 0.0  # simulated weight-loading time (worker NOT_SERVING meanwhile)
    answer_tokens: int = 48  # natural answer length before end-of-sequence
    kv_cache_tokens: int = 262_144  # KV budget in tokens
    # Faults injected at runtime (tests, rollout benchmarks): a JSON file re-read when it
    # changes, see `model_service.engines.sim.Faults`. "" = none.
    fault_file: str = ""
    # Prefix cache (`engines/sim_cache.py`): full blocks of prompt tokens kept, LRU, in the
    # KV space running requests leave free; hits are reported as cached prompt tokens.
    prefix_cache: bool = True
    block_tokens: int = 16
    # Prefill speed in prompt tokens/s: > 0 makes TTFT `ttft_s` + uncached prompt tokens /
    # this rate, one prefill at a time (as one forward pass at a time); 0: a flat `ttft_s`.
    prefill_tokens_per_s: float = 0.0


@dataclass(slots=True)
class VllmOptions:
    """vLLM engine settings, passed through to AsyncEngineArgs."""

    gpu_memory_utilization: float = 0.3
    # KV cache size in GiB (vLLM's kv_cache_memory_bytes, the fractional form of the CPU
    # backend's VLLM_CPU_KVCACHE_SPACE); None: gpu_memory_utilization decides.
    kv_cache_space_gb: float | None = None
    enable_prefix_caching: bool = True
    speculative_config: str | None = None  # JSON, e.g. {"method": "ngram", ...}
    dtype: str = "auto"
    # None: eager on CPU (torch.compile there costs a minute per start: vllm-cpu 0.32 fails to
    # load its own compile cache), compiled (CUDA graphs) on GPU.
    enforce_eager: bool | None = None
    # vLLM tool parser for tool choice `auto` (e.g. "hermes"); "" = auto is refused.
    tool_call_parser: str = ""
    # vLLM's parallelism, passed through (engines/vllm_parallel.py): ranks per replica =
    # tensor x pipeline; data parallel replicas; executor "mp" (one node), "ray" (nodes).
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    distributed_executor_backend: str | None = None  # None: vLLM picks
    otlp_traces_endpoint: str = ""  # vLLM's own tracing: the worker's --otlp-endpoint
    extra_args: dict[str, object] = field(default_factory=dict)


@dataclass(slots=True)
class TritonOptions:
    """An existing Triton Inference Server as the engine, over its gRPC API, speaking the
    model interface of Triton's vLLM backend (engines/triton.py)."""

    url: str = "127.0.0.1:8001"  # Triton's gRPC address
    model: str = "vllm_model"  # the model's name in Triton's repository
    # TLS to Triton: on with a CA (else the system roots with `tls`); mTLS with cert+key.
    tls: bool = False
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    health_interval_s: float = 1.0  # how often Triton's readiness is polled


@dataclass(slots=True)
class EngineConfig:
    """Which engine, which model, and the limits every engine shares."""

    engine: str = "vllm"  # the real engine unless `sim` is asked for
    model: str = ""  # model directory (vllm) or label (sim)
    served_model_name: str = ""  # name clients use; default: basename of `model`
    version: str = ""  # deployment version label (canary routing)
    max_model_len: int = 2048
    max_num_seqs: int = 32  # batch slots
    default_max_tokens: int = 512
    sim: SimOptions = field(default_factory=SimOptions)
    vllm: VllmOptions = field(default_factory=VllmOptions)
    triton: TritonOptions = field(default_factory=TritonOptions)

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        if self.model:
            return os.path.basename(os.path.normpath(self.model))
        return f"{self.engine}-model"


@dataclass(slots=True)
class Limits:
    """Request limits enforced before the engine sees anything."""

    max_prompt_bytes: int = 1_048_576
    max_messages: int = 1024
    max_stop_strings: int = 16
    max_stop_length: int = 256
    max_request_id_bytes: int = 128
    max_generations_per_stream: int = 256


@dataclass(slots=True)
class AdmissionConfig:
    """Overload protection: refuse fast rather than queue without bound."""

    max_waiting: int = 64  # generations admitted beyond the batch slots
    kv_high_watermark: float = 0.98  # refuse while KV use is above this and others wait
    # Batch slots (and places) kept per higher priority class in use; None (auto): what
    # takes it to one more than its recent peak, at most half the slots in all.
    priority_headroom: int | None = None


@dataclass(slots=True)
class ReplayConfig:
    """Resumable generations: detach grace and the replay log's retention and cap."""

    default_detach_grace_s: float = 5.0  # for starts that carry no detach_grace_ms
    max_detach_grace_s: float = 60.0  # cap on a request's own detach_grace_ms
    retention_s: float = 60.0  # how long an ended generation stays resumable
    max_bytes: int = 256 * 1024 * 1024  # replay log cap (approximate bytes)


@dataclass(slots=True)
class ServerConfig:
    """gRPC server settings."""

    host: str = "127.0.0.1"
    port: int = 50051
    drain_grace_s: float = 30.0
    max_message_bytes: int = 8 * 1024 * 1024
    # Streams per HTTP/2 connection: an edge multiplexes all of its clients' generations
    # over one channel, so this must exceed the streams one edge carries.
    max_concurrent_streams: int = 65536
    keepalive_time_s: float = 30.0
    keepalive_timeout_s: float = 10.0
    metrics_port: int | None = None  # Prometheus /metrics on this HTTP port (0 = any free)
    # TLS: with cert and key the gRPC port speaks TLS; with a client CA as well, it
    # requires client certificates signed by that CA (mTLS).
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    # A plaintext port serving only grpc.health.v1 (Kubernetes gRPC probes speak no TLS).
    health_port: int | None = None

    def grpc_options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_concurrent_streams", self.max_concurrent_streams),
            ("grpc.keepalive_time_ms", int(self.keepalive_time_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(self.keepalive_timeout_s * 1000)),
            # Clients (edges) ping idle channels; allow it without a call in flight.
            ("grpc.keepalive_permit_without_calls", 1),
            # Edges ping every 2 s to find a frozen worker within seconds (edge --keepalive).
            ("grpc.http2.min_ping_interval_without_data_ms", 1000),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.so_reuseport", 0),
        ]


@dataclass(slots=True)
class WorkerConfig:
    """Everything the worker needs."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    limits: Limits = field(default_factory=Limits)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    log_level: str = "info"
    # One info record per generation (request_id, trace_id, code, tokens, timings), as
    # uvicorn's access log; off, they are debug records. It costs as much as the rest of a
    # short request's bookkeeping, so the CLI turns it on only with --log-format json.
    access_log: bool = False
    # Event loop, as uvicorn's --loop: uvloop when installed (cheaper per message), else
    # asyncio's own.
    loop: str = "auto"
    # OpenTelemetry traces (model_service/tracing.py): "" = off (flag, else OTEL_* vars).
    otlp_endpoint: str = ""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="model_service", description="Sluice model worker (gRPC).")
    d = WorkerConfig()
    p.add_argument(
        "--engine",
        default=d.engine.engine,
        help="engine: vllm (default), triton (an existing Triton server) or sim (simulated)",
    )
    p.add_argument(
        "--model",
        default=d.engine.model,
        help="model directory (vllm: required; triton: its tokenizer and chat template)",
    )
    p.add_argument("--served-model-name", default="", help="model name clients use")
    p.add_argument("--model-version", default="", help="version label for routing")
    p.add_argument("--host", default=d.server.host)
    p.add_argument("--port", type=int, default=d.server.port, help="0 picks a free port")
    p.add_argument("--port-file", default="", help="write the bound port here once serving")
    p.add_argument(
        "--max-concurrent-streams",
        type=int,
        default=d.server.max_concurrent_streams,
        help="HTTP/2 streams per client connection",
    )
    p.add_argument("--metrics-port", type=int, default=None, help="Prometheus HTTP port")
    p.add_argument("--tls-cert", default="", help="PEM server certificate (enables TLS)")
    p.add_argument("--tls-key", default="", help="PEM private key of --tls-cert")
    p.add_argument("--tls-client-ca", default="", help="PEM CA: require client certs (mTLS)")
    p.add_argument("--health-port", type=int, default=None, help="plaintext health-only port")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    p.add_argument("--drain-grace", type=float, default=d.server.drain_grace_s, help="seconds")
    p.add_argument("--max-model-len", type=int, default=d.engine.max_model_len)
    p.add_argument("--max-num-seqs", type=int, default=d.engine.max_num_seqs, help="batch slots")
    p.add_argument("--max-waiting", type=int, default=d.admission.max_waiting)
    p.add_argument(
        "--priority-headroom",
        type=_non_negative,
        default=None,
        help="batch slots kept for each higher priority class while it is in use "
        "(default: auto, room for one more than its recent peak; at most half the slots)",
    )
    p.add_argument("--default-max-tokens", type=int, default=d.engine.default_max_tokens)
    p.add_argument(
        "--default-detach-grace",
        type=float,
        default=d.replay.default_detach_grace_s,
        help="seconds a generation runs on after its consumer left, for starts without "
        "their own detach_grace_ms (0 = abort at once)",
    )
    p.add_argument("--replay-retention", type=float, default=d.replay.retention_s, help="seconds")
    p.add_argument("--replay-max-mb", type=float, default=d.replay.max_bytes / 2**20)
    p.add_argument("--max-prompt-bytes", type=int, default=d.limits.max_prompt_bytes)
    p.add_argument("--sim-ttft", type=float, default=d.engine.sim.ttft_s, help="seconds")
    p.add_argument("--sim-token-delay", type=float, default=d.engine.sim.token_delay_s)
    p.add_argument("--sim-startup", type=float, default=d.engine.sim.startup_s)
    p.add_argument("--sim-answer-tokens", type=int, default=d.engine.sim.answer_tokens)
    p.add_argument("--sim-kv-tokens", type=int, default=d.engine.sim.kv_cache_tokens)
    p.add_argument(
        "--sim-fault-file",
        default="",
        help='JSON faults re-read on change: {"error_rate", "error_after_tokens", "ttft_s"}',
    )
    p.add_argument(
        "--sim-prefix-cache",
        action=argparse.BooleanOptionalAction,
        default=d.engine.sim.prefix_cache,
        help="sim: keep prompt KV blocks for later prompts (LRU)",
    )
    p.add_argument("--sim-block-size", type=int, default=d.engine.sim.block_tokens)
    p.add_argument(
        "--sim-prefill-rate",
        type=float,
        default=d.engine.sim.prefill_tokens_per_s,
        help="sim: uncached prompt tokens prefilled per second, one prefill at a time "
        "(TTFT = --sim-ttft + uncached/rate); 0: a flat --sim-ttft",
    )
    p.add_argument(
        "--gpu-memory-utilization", type=float, default=d.engine.vllm.gpu_memory_utilization
    )
    p.add_argument("--kv-cache-space-gb", type=float, default=None)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--speculative-config", default=None, help="JSON for vLLM speculative decoding")
    p.add_argument("--dtype", default=d.engine.vllm.dtype)
    p.add_argument(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vLLM without torch.compile / CUDA graphs (default: on for CPU, off for GPU)",
    )
    p.add_argument(
        "--tool-call-parser",
        default="",
        help="vLLM tool parser for tool_choice auto, e.g. hermes (default: auto is refused; "
        "required and named tool choices work without one)",
    )
    _parallel_args(p)
    _triton_args(p, d.engine.triton)
    p.add_argument("--log-level", default=d.log_level)
    p.add_argument(
        "--otlp-endpoint",
        default="",
        help="OTLP/gRPC endpoint for traces (tracing on); also OTEL_EXPORTER_OTLP_ENDPOINT",
    )
    p.add_argument(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="an info record per generation (default: on with --log-format json)",
    )
    p.add_argument(
        "--loop",
        choices=LOOPS,
        default=d.loop,
        help="event loop: uvloop when installed (auto), or asyncio's",
    )
    return p


def _parallel_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("vLLM parallelism (models bigger than one GPU)")
    g.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per layer shard")
    g.add_argument("--pipeline-parallel-size", type=int, default=1, help="layer stages")
    g.add_argument("--data-parallel-size", type=int, default=1, help="engine replicas")
    g.add_argument(
        "--distributed-executor-backend",
        choices=("mp", "ray", "uni", "external_launcher"),
        default=None,
        help="how vLLM starts its ranks: mp (one node) or ray (a Ray cluster, many nodes)",
    )


def _triton_args(p: argparse.ArgumentParser, d: TritonOptions) -> None:
    g = p.add_argument_group("triton engine (--engine triton)")
    g.add_argument("--triton-url", default=d.url, help="Triton's gRPC address, host:port")
    g.add_argument("--triton-model", default=d.model, help="the model's name in Triton")
    g.add_argument(
        "--triton-tls", action="store_true", help="TLS to Triton (system roots unless a CA)"
    )
    g.add_argument("--triton-tls-ca", default="", help="PEM CA for Triton's certificate")
    g.add_argument("--triton-tls-cert", default="", help="PEM client certificate (mTLS)")
    g.add_argument("--triton-tls-key", default="", help="PEM key of --triton-tls-cert")
    g.add_argument(
        "--triton-health-interval",
        type=float,
        default=d.health_interval_s,
        help="seconds between readiness checks of Triton's model",
    )


def _triton_options(args: argparse.Namespace) -> TritonOptions:
    return TritonOptions(
        url=args.triton_url,
        model=args.triton_model,
        tls=args.triton_tls or bool(args.triton_tls_ca or args.triton_tls_cert),
        tls_ca=args.triton_tls_ca,
        tls_cert=args.triton_tls_cert,
        tls_key=args.triton_tls_key,
        health_interval_s=args.triton_health_interval,
    )


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def config_from_args(args: argparse.Namespace) -> WorkerConfig:
    """Turn parsed CLI arguments into a WorkerConfig."""
    engine = EngineConfig(
        engine=args.engine,
        model=args.model,
        served_model_name=args.served_model_name,
        version=args.model_version,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        default_max_tokens=args.default_max_tokens,
        sim=SimOptions(
            ttft_s=args.sim_ttft,
            token_delay_s=args.sim_token_delay,
            startup_s=args.sim_startup,
            answer_tokens=args.sim_answer_tokens,
            kv_cache_tokens=args.sim_kv_tokens,
            fault_file=args.sim_fault_file,
            prefix_cache=args.sim_prefix_cache,
            block_tokens=args.sim_block_size,
            prefill_tokens_per_s=args.sim_prefill_rate,
        ),
        vllm=VllmOptions(
            gpu_memory_utilization=args.gpu_memory_utilization,
            kv_cache_space_gb=args.kv_cache_space_gb,
            enable_prefix_caching=not args.no_prefix_caching,
            speculative_config=args.speculative_config,
            dtype=args.dtype,
            enforce_eager=args.enforce_eager,
            tool_call_parser=args.tool_call_parser,
            tensor_parallel_size=args.tensor_parallel_size,
            pipeline_parallel_size=args.pipeline_parallel_size,
            data_parallel_size=args.data_parallel_size,
            distributed_executor_backend=args.distributed_executor_backend,
            otlp_traces_endpoint=otel.endpoint_from_env(args.otlp_endpoint),
        ),
        triton=_triton_options(args),
    )
    return WorkerConfig(
        engine=engine,
        server=ServerConfig(
            host=args.host,
            port=args.port,
            drain_grace_s=args.drain_grace,
            metrics_port=args.metrics_port,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_client_ca=args.tls_client_ca,
            health_port=args.health_port,
            max_concurrent_streams=args.max_concurrent_streams,
        ),
        limits=Limits(max_prompt_bytes=args.max_prompt_bytes),
        admission=AdmissionConfig(
            max_waiting=args.max_waiting, priority_headroom=args.priority_headroom
        ),
        replay=ReplayConfig(
            default_detach_grace_s=args.default_detach_grace,
            retention_s=args.replay_retention,
            max_bytes=int(args.replay_max_mb * 2**20),
        ),
        log_level=args.log_level,
        access_log=args.log_format == "json" if args.access_log is None else args.access_log,
        loop=args.loop,
        otlp_endpoint=otel.endpoint_from_env(args.otlp_endpoint),
    )
