"""Worker configuration, declared once: dataclasses whose fields carry their flag, default
and help (`sluice_common.options.option`); the parser and the way back are made from them.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any

from sluice_common import otel
from sluice_common.options import add_section, option, section_from

LOOPS = ("auto", "asyncio", "uvloop")
EXECUTORS = ("mp", "ray", "uni", "external_launcher")
RUNNERS = ("generate", "pooling")
BOOL = argparse.BooleanOptionalAction
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the ranks vLLM's LoRA kernels take
DEFAULT_MAX_LORAS = 4


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


@dataclass(slots=True)
class SimOptions:
    """The simulated engine: a continuous-batching LLM stand-in for tests and benchmarks."""

    ttft_s: float = option(0.02, "--sim-ttft", "prefill time before the first token, seconds")
    token_delay_s: float = option(
        0.005, "--sim-token-delay", "decode time per token, seconds (0: as fast as possible)"
    )
    step: str = option(
        "batch",
        "--sim-step",
        "sim: when a decoding sequence takes its next token: batch (one timer for all, "
        "as a continuous-batching engine steps) or own (each on its own schedule, one "
        "token every --sim-token-delay from its first: independent long-lived streams)",
        choices=("batch", "own"),
    )
    startup_s: float = option(
        0.0, "--sim-startup", "simulated weight loading, seconds (NOT_SERVING meanwhile)"
    )
    answer_tokens: int = option(48, "--sim-answer-tokens", "answer length before end-of-sequence")
    kv_cache_tokens: int = option(262_144, "--sim-kv-tokens", "KV budget, tokens")
    fault_file: str = option(
        "",
        "--sim-fault-file",
        'JSON faults re-read on change: {"error_rate", "error_after_tokens", "ttft_s"}',
    )
    prefix_cache: bool = option(
        True,
        "--sim-prefix-cache",
        "sim: keep prompt KV blocks for later prompts (LRU)",
        action=BOOL,
    )
    block_tokens: int = option(16, "--sim-block-size", "prefix cache block, tokens")
    answer: str = option(
        "",
        "--sim-answer",
        "sim: answer every generation with this text (words, spaces, marks and <tags> as "
        "tokens) instead of sampling, e.g. a thinking model's '<think> ... </think> ...'",
    )
    embedding_size: int = option(
        64, "--sim-embedding-size", "sim with --runner pooling: a full vector's length"
    )
    prefill_tokens_per_s: float = option(
        0.0,
        "--sim-prefill-rate",
        "sim: uncached prompt tokens prefilled per second, one prefill at a time "
        "(TTFT = --sim-ttft + uncached/rate); 0: a flat --sim-ttft",
    )


@dataclass(slots=True)
class VllmOptions:
    """vLLM engine settings, passed through to AsyncEngineArgs."""

    gpu_memory_utilization: float = option(
        0.3, "--gpu-memory-utilization", "share of GPU memory vLLM may take"
    )
    # vLLM's kv_cache_memory_bytes, the fractional form of the CPU backend's
    # VLLM_CPU_KVCACHE_SPACE.
    kv_cache_space_gb: float | None = option(
        None,
        "--kv-cache-space-gb",
        "KV cache size, GiB (default: --gpu-memory-utilization decides)",
        type=float,
    )
    enable_prefix_caching: bool = option(
        True, "--no-prefix-caching", "turn vLLM's prefix caching off", action="store_false"
    )
    speculative_config: str | None = option(
        None, "--speculative-config", "JSON for vLLM speculative decoding"
    )
    kv_events: bool = option(
        False,
        "--kv-events",
        "publish vLLM's KV-cache events to the worker (WatchCache, for kv_aware edges)",
        action=BOOL,
    )
    dtype: str = option("auto", "--dtype", "weights' dtype (auto: the model's)")
    # On CPU, torch.compile costs a minute per start (vllm-cpu 0.32 fails to load its own
    # compile cache).
    enforce_eager: bool | None = option(
        None,
        "--enforce-eager",
        "vLLM without torch.compile / CUDA graphs (default: on for CPU, off for GPU)",
        action=BOOL,
    )
    tool_call_parser: str = option(
        "",
        "--tool-call-parser",
        "vLLM tool parser for tool_choice auto, e.g. hermes (default: auto is refused; "
        "required and named tool choices work without one)",
    )
    # Parallelism, passed through (engines/vllm/parallel.py): ranks per replica = tensor x
    # pipeline; data-parallel replicas; how the ranks start.
    tensor_parallel_size: int = option(1, "--tensor-parallel-size", "GPUs per layer shard")
    pipeline_parallel_size: int = option(1, "--pipeline-parallel-size", "layer stages")
    data_parallel_size: int = option(1, "--data-parallel-size", "engine replicas")
    distributed_executor_backend: str | None = option(
        None,
        "--distributed-executor-backend",
        "how vLLM starts its ranks: mp (one node) or ray (a Ray cluster, many nodes)",
        choices=EXECUTORS,
    )
    openai_port_file: str = option(
        "",
        "--vllm-openai-port-file",
        "test only: also serve vLLM's own OpenAI server over this engine on 127.0.0.1 "
        "(no admission), its port written to this file",
    )
    otlp_traces_endpoint: str = ""  # vLLM's own tracing: the worker's --otlp-endpoint
    extra_args: dict[str, object] = field(default_factory=dict)


@dataclass(slots=True)
class TritonOptions:
    """An existing Triton server as the engine (engines/triton/)."""

    url: str = option("127.0.0.1:8001", "--triton-url", "Triton's gRPC address, host:port")
    model: str = option("vllm_model", "--triton-model", "the model's name in Triton")
    # On with a CA or a client certificate too (`config_from_args`).
    tls: bool = option(
        False, "--triton-tls", "TLS to Triton (system roots unless a CA)", action="store_true"
    )
    tls_ca: str = option("", "--triton-tls-ca", "PEM CA for Triton's certificate")
    tls_cert: str = option("", "--triton-tls-cert", "PEM client certificate (mTLS)")
    tls_key: str = option("", "--triton-tls-key", "PEM key of --triton-tls-cert")
    health_interval_s: float = option(
        1.0, "--triton-health-interval", "seconds between readiness checks of Triton's model"
    )


@dataclass(slots=True)
class EngineConfig:
    """Which engine, which model, and the limits every engine shares."""

    engine: str = option(
        "vllm",
        "--engine",
        "engine: vllm (default), triton (an existing Triton server) or sim (simulated)",
    )
    model: str = option(
        "", "--model", "model directory (vllm: required; triton: its tokenizer and chat template)"
    )
    served_model_name: str = option("", "--served-model-name", "model name clients use")
    version: str = option("", "--model-version", "version label for routing")
    max_model_len: int = option(2048, "--max-model-len", "context length, tokens")
    max_num_seqs: int = option(32, "--max-num-seqs", "batch slots")
    default_max_tokens: int = option(
        0,
        "--default-max-tokens",
        "max_tokens of a start that sets none, bounded by the context "
        "(0: no cap, the rest of the context, as vLLM's server)",
    )
    # LoRA adapters beside the base model (`intake/adapters.py`): loaded at start, and at
    # run time through LoadAdapter / UnloadAdapter.
    loras: list[str] = option(
        [],
        "--lora",
        "LoRA adapter NAME=PATH (PEFT directory) loaded at start (repeat)",
        action="append",
    )
    max_loras: int | None = option(
        None,
        "--max-loras",
        "LoRA adapters held at once, all kept in the engine (default: 4 with --lora, "
        "else 0: adapters off)",
        type=non_negative,
    )
    max_lora_rank: int = option(
        16, "--max-lora-rank", "highest LoRA rank an adapter may have", choices=LORA_RANKS
    )
    runner: str = option(
        "generate",
        "--runner",
        "what the model serves: generate (tokens) or pooling (embeddings through `Embed`; "
        "vLLM converts a decoder model to an embedding model, the sim embeds by token)",
        choices=RUNNERS,
    )
    reasoning_parser: str = option(
        "",
        "--reasoning-parser",
        "vLLM reasoning parser splitting the model's thinking from its answer (chunks' "
        "`reasoning`), e.g. deepseek_r1, qwen3 (default: none, all output is the answer)",
    )
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
class LimitsConfig:
    """Request limits enforced before the engine sees anything."""

    max_prompt_bytes: int = option(
        1_048_576, "--max-prompt-bytes", "longest prompt (or chat content), bytes"
    )
    max_messages: int = 1024
    max_stop_strings: int = 16
    max_stop_length: int = 256
    max_request_id_bytes: int = 128
    max_generations_per_stream: int = 256
    max_generations_per_session: int = 65_536
    # What a constraint may cost (`intake/bounds.py`; defaults: OpenAI's published limits).
    max_schema_properties: int = option(
        5_000, "--max-schema-properties", "object properties in one JSON schema, all levels"
    )
    max_schema_enum_values: int = option(
        1_000, "--max-schema-enum-values", "enum and const values in one JSON schema"
    )
    max_constraint_chars: int = option(
        120_000,
        "--max-constraint-chars",
        "characters of a schema's names and values, a regex, a grammar or the choices",
    )
    max_regex_repeat: int = option(
        1_000, "--max-regex-repeat", "the largest count of a regex repetition {m,n}"
    )
    max_grammar_rules: int = option(1_000, "--max-grammar-rules", "rules of one grammar")
    # The backend's own cost, measured: each new constraint compiled once in a child
    # process before the engine sees it (`constraints/`).
    max_constraint_compile_s: float = option(
        5.0, "--max-constraint-compile-s", "seconds a new constraint may take to compile"
    )
    max_constraint_compile_mb: int = option(
        1024, "--max-constraint-compile-mb", "memory a new constraint's compile may take, MiB"
    )
    constraint_compilers: int = option(
        2,
        "--constraint-compilers",
        "processes compiling new constraints within those bounds (0: not measured)",
        type=non_negative,
    )
    chat_roles: list[str] = option(
        [],
        "--chat-role",
        "a chat role beyond OpenAI's five that the model's template defines (repeat)",
        action="append",
    )


@dataclass(slots=True)
class AdmissionConfig:
    """Overload protection: refuse fast rather than queue without bound."""

    max_waiting: int = option(
        64, "--max-waiting", "generations admitted beyond the batch slots (the worker's queue)"
    )
    kv_high_watermark: float = 0.98  # refuse while KV use is above this and others wait
    priority_headroom: int | None = option(
        None,
        "--priority-headroom",
        "batch slots kept for each higher priority class while it is in use "
        "(default: auto, room for one more than its recent peak; at most half the slots)",
        type=non_negative,
    )


@dataclass(slots=True)
class ReplayConfig:
    """Resumable generations: detach grace and the replay log's retention and cap."""

    default_detach_grace_s: float = option(
        5.0,
        "--default-detach-grace",
        "seconds a generation runs on after its consumer left, for starts without "
        "their own detach_grace_ms (0 = abort at once)",
    )
    max_detach_grace_s: float = 60.0  # cap on a request's own detach_grace_ms
    retention_s: float = option(
        60.0, "--replay-retention", "seconds an ended generation stays resumable"
    )
    max_mb: float = option(256.0, "--replay-max-mb", "replay logs' cap, MiB (approximate)")

    @property
    def max_bytes(self) -> int:
        return int(self.max_mb * 2**20)


@dataclass(slots=True)
class ServerConfig:
    """gRPC server settings."""

    host: str = option("127.0.0.1", "--host", "address to listen on")
    port: int = option(50051, "--port", "0 picks a free port")
    port_file: str = option("", "--port-file", "write the bound port here once serving")
    drain_grace_s: float = option(
        30.0, "--drain-grace", "seconds in-flight generations may finish on SIGTERM"
    )
    max_message_bytes: int = 8 * 1024 * 1024
    # An edge multiplexes all of its clients' generations over one channel, so this must
    # exceed the streams one edge carries.
    max_concurrent_streams: int = option(
        65536, "--max-concurrent-streams", "HTTP/2 streams per client connection"
    )
    keepalive_time_s: float = 30.0
    keepalive_timeout_s: float = 10.0
    metrics_port: int | None = option(
        None, "--metrics-port", "Prometheus HTTP port (0 = any free)", type=int
    )
    tls_cert: str = option("", "--tls-cert", "PEM server certificate (enables TLS)")
    tls_key: str = option("", "--tls-key", "PEM private key of --tls-cert")
    tls_client_ca: str = option("", "--tls-client-ca", "PEM CA: require client certs (mTLS)")
    # Kubernetes gRPC probes speak no TLS.
    health_port: int | None = option(None, "--health-port", "plaintext health-only port", type=int)

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
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    log_level: str = option("info", "--log-level", "log level")
    log_format: str = option("text", "--log-format", "text or json", choices=("text", "json"))
    # One info record per generation, as uvicorn's access log (off: debug records). It
    # costs as much as the rest of a short request's bookkeeping, hence on only for json
    # unless told (None until `config_from_args` decides).
    access_log: bool | None = option(
        None,
        "--access-log",
        "an info record per generation (default: on with --log-format json)",
        action=BOOL,
    )
    loop: str = option(
        "auto", "--loop", "event loop: uvloop when installed (auto), or asyncio's", choices=LOOPS
    )
    # Traces (obs/tracing.py), also from OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT.
    otlp_endpoint: str = option(
        "",
        "--otlp-endpoint",
        "OTLP/gRPC endpoint for traces (tracing on); also OTEL_EXPORTER_OTLP_ENDPOINT",
    )


# Sections in --help order: (dest prefix, dataclass, group title).
SECTIONS: tuple[tuple[str, Any, str], ...] = (
    ("engine", EngineConfig, "engine and model"),
    ("sim", SimOptions, "sim engine (--engine sim)"),
    ("vllm", VllmOptions, "vllm engine (parallelism: models bigger than one GPU)"),
    ("triton", TritonOptions, "triton engine (--engine triton)"),
    ("server", ServerConfig, "gRPC server"),
    ("admission", AdmissionConfig, "admission and the worker's queue"),
    ("limits", LimitsConfig, "request limits"),
    ("replay", ReplayConfig, "resume and replay"),
    ("worker", WorkerConfig, "logs, tracing, event loop"),
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="model_service", description="Sluice model worker (gRPC).")
    for name, cls, title in SECTIONS:
        add_section(p.add_argument_group(title), name, cls)
    return p


def config_from_args(args: argparse.Namespace) -> WorkerConfig:
    """Turn parsed CLI arguments into a WorkerConfig."""
    s = {name: section_from(args, name, cls) for name, cls, _ in SECTIONS}
    engine: EngineConfig = s["engine"]
    engine.sim, engine.vllm, engine.triton = s["sim"], s["vllm"], s["triton"]
    config: WorkerConfig = s["worker"]
    config.engine, config.server, config.limits = engine, s["server"], s["limits"]
    config.admission, config.replay = s["admission"], s["replay"]
    # Flags that decide others' values.
    triton = engine.triton
    triton.tls = triton.tls or bool(triton.tls_ca or triton.tls_cert)
    config.otlp_endpoint = otel.endpoint_from_env(config.otlp_endpoint)
    engine.vllm.otlp_traces_endpoint = config.otlp_endpoint
    if config.access_log is None:
        config.access_log = config.log_format == "json"
    if engine.max_loras is None:
        engine.max_loras = max(DEFAULT_MAX_LORAS, len(engine.loras)) if engine.loras else 0
    return config
