"""The harness's CLI and the dataclasses it fills (one per concern)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

from scripts.bench.load import LoadConfig
from scripts.bench.stacks import EngineSettings
from scripts.bench.workload import WorkloadConfig

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL_DIR = os.environ.get(
    "SLUICE_MODEL_DIR", str(Path.home() / ".cache/sluice/models/SmolLM2-135M-Instruct")
)
MODES = ("run", "overhead", "compare", "routing", "decision", "selftest")
DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_ADDRESS = "127.0.0.1:50051"
DEFAULT_OUT = ROOT / "scripts" / "results"
# grpc: the worker directly; sse: through the edge; router: through vllm-router -> edge.
OVERHEAD_TARGETS = ("grpc", "sse", "router")
# routing mode (scripts/bench/routing.py): our edge's policies and vllm-router's cache_aware.
ROUTING_TARGETS = ("cache_aware", "session", "session-key", "least_load", "random", "router")


@dataclass(frozen=True, slots=True)
class TargetConfig:
    """Where `run` mode sends requests, and how."""

    kind: str = "sse"  # "sse" (any OpenAI-compatible server) or "grpc" (a worker)
    url: str = DEFAULT_URL
    address: str = DEFAULT_ADDRESS
    model: str = ""
    api_key: str = ""
    stamp: bool | None = None  # None: on in overhead mode, off otherwise
    grpc_channels: int = 1
    timeout_s: float = 600.0


@dataclass(frozen=True, slots=True)
class OverheadConfig:
    """Transport-only runs on the sim engine: which targets, which stack."""

    targets: tuple[str, ...] = ("grpc", "sse")  # of OVERHEAD_TARGETS
    worker: str = ""  # an existing sim worker; empty: start one
    edge: str = ""  # an existing edge URL; empty: start one
    sim_ttft_s: float = 0.0
    sim_token_delay_s: float = 0.0
    worker_args: tuple[str, ...] = ()
    edge_args: tuple[str, ...] = ()
    router_args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RoutingBenchConfig:
    """Placement policies side by side on sim workers with prefix caches (routing mode)."""

    targets: tuple[str, ...] = ("cache_aware", "session", "random", "router")
    workers: int = 4
    prefill_rate: float = 20_000.0  # sim prompt tokens prefilled per second, per worker
    kv_tokens: int = 65_536  # sim KV cache per worker, tokens
    worker_args: tuple[str, ...] = ()
    edge_args: tuple[str, ...] = ()
    router_args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CompareConfig:
    """Side-by-side runs of two targets, alternating."""

    targets: tuple[str, ...] = ()
    model_dir: str = DEFAULT_MODEL_DIR
    engine: EngineSettings = field(default_factory=EngineSettings)
    one_at_a_time: bool = False  # start each stack only for its own runs


@dataclass(frozen=True, slots=True)
class OutputConfig:
    out_dir: Path = DEFAULT_OUT
    name: str = ""
    plot: bool = True
    progress: bool = True


@dataclass(frozen=True, slots=True)
class BenchConfig:
    mode: str = "run"
    target: TargetConfig = field(default_factory=TargetConfig)
    load: LoadConfig = field(default_factory=LoadConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    overhead: OverheadConfig = field(default_factory=OverheadConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    routing: RoutingBenchConfig = field(default_factory=RoutingBenchConfig)
    rounds: int = 1
    procs: int = 1
    watch: tuple[tuple[str, int], ...] = ()  # extra processes to watch: (label, pid)
    selftest_events: int = 200_000


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench",
        description="Load generator and benchmark harness: Sluice and OpenAI-compatible servers.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--mode", choices=MODES, default="run")
    t = p.add_argument_group("target (run mode)")
    t.add_argument("--target", choices=("sse", "grpc"), default="sse")
    t.add_argument("--url", default=DEFAULT_URL, help="base URL of an OpenAI-compatible server")
    t.add_argument("--address", default=DEFAULT_ADDRESS, help="worker host:port (grpc)")
    t.add_argument("--model", default="", help="model name (default: the server's first)")
    t.add_argument("--api", choices=("chat", "completions"), default="chat")
    t.add_argument("--api-key", default="")
    t.add_argument("--stamp", action=argparse.BooleanOptionalAction, default=None,
                   help="ask for worker time stamps (default: on in overhead mode)")  # fmt: skip
    t.add_argument("--grpc-channels", type=int, default=1)
    t.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    lg = p.add_argument_group("load")
    lg.add_argument("--concurrency", type=int, default=8, help="closed loop: streams in flight")
    lg.add_argument("--rate", type=float, default=0.0, help="open loop: Poisson arrivals/s")
    lg.add_argument("--max-concurrency", type=int, default=0, help="open loop cap (0 = none)")
    lg.add_argument("--duration", type=float, default=0.0, help="seconds of issuing requests")
    lg.add_argument("--requests", type=int, default=0, help="requests to send (per round)")
    lg.add_argument("--warmup", type=int, default=0, help="discarded requests first")
    lg.add_argument("--ramp", type=float, default=0.0, help="closed loop: streams started/s")
    lg.add_argument("--drain-timeout", type=float, default=60.0)
    lg.add_argument("--procs", type=int, default=1, help="harness processes sharing the load")
    w = p.add_argument_group("workload")
    w.add_argument("--prompt-tokens", type=int, default=64)
    w.add_argument("--prompt-spread", type=float, default=0.0, help="fraction, uniform +-")
    w.add_argument("--output-tokens", type=int, default=128, help="max_tokens")
    w.add_argument("--output-spread", type=float, default=0.0)
    w.add_argument("--no-ignore-eos", action="store_true", help="let the model stop early")
    w.add_argument("--temperature", type=float, default=0.0)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--workload", choices=("single", "multiturn"), default="single",
                   help="independent prompts, or conversations (conversations.py)")  # fmt: skip
    w.add_argument("--users", type=int, default=128, help="multiturn: conversations open")
    w.add_argument("--turns", type=int, default=8, help="multiturn: turns per conversation")
    w.add_argument("--system-prompts", type=int, default=4, help="multiturn: shared ones")
    w.add_argument("--system-tokens", type=int, default=256, help="multiturn: words in each")
    w.add_argument("--session-user", action="store_true",
                   help="multiturn: the conversation as the OpenAI `user`")  # fmt: skip
    o = p.add_argument_group("overhead mode (sim engine, transport only)")
    o.add_argument("--targets", default="grpc,sse",
                   help="comma-separated: grpc, sse (edge), router (vllm-router+edge)")  # fmt: skip
    o.add_argument("--worker", default="", help="use this sim worker instead of starting one")
    o.add_argument("--edge", default="", help="use this edge URL instead of starting one")
    o.add_argument("--sim-ttft", type=float, default=0.0)
    o.add_argument("--sim-token-delay", type=float, default=0.0)
    o.add_argument("--worker-arg", action="append", default=[], help="extra worker flag")
    o.add_argument("--edge-arg", action="append", default=[], help="extra edge flag")
    o.add_argument("--router-arg", action="append", default=[],
                   help="extra vllm-router flag (default --policy round_robin)")  # fmt: skip
    r = p.add_argument_group("routing mode (sim workers with prefix caches)")
    r.add_argument("--routing-targets", default="cache_aware,session,random,router",
                   help=f"comma-separated, of {', '.join(ROUTING_TARGETS)}")  # fmt: skip
    r.add_argument("--routing-workers", type=int, default=4)
    r.add_argument("--sim-prefill-rate", type=float, default=20_000.0, help="tokens/s")
    r.add_argument("--sim-kv-tokens", type=int, default=65_536, help="per worker")
    c = p.add_argument_group("compare mode")
    c.add_argument("--compare", nargs=2, metavar=("A", "B"),
                   help="sluice | sluice-grpc | vllm | sse:URL | grpc:ADDR")  # fmt: skip
    c.add_argument("--model-dir", default=DEFAULT_MODEL_DIR)
    c.add_argument("--max-model-len", type=int, default=2048)
    c.add_argument("--max-num-seqs", type=int, default=32)
    c.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    c.add_argument("--kv-cache-gb", type=float, default=None, help="CPU KV cache, both stacks")
    c.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                   help="both stacks (default: eager without an NVIDIA GPU)")  # fmt: skip
    c.add_argument("--one-at-a-time", action="store_true",
                   help="run one stack at a time (when two engines do not fit)")  # fmt: skip
    g = p.add_argument_group("output and misc")
    g.add_argument("--rounds", type=int, default=1, help="overhead/compare: alternating rounds")
    g.add_argument("--watch-pid", action="append", default=[], metavar="LABEL=PID")
    g.add_argument("--out", default=str(DEFAULT_OUT), help="result directory")
    g.add_argument("--name", default="", help="result file name (default: mode-time)")
    g.add_argument("--no-plot", action="store_true")
    g.add_argument("--no-progress", action="store_true")
    g.add_argument("--selftest-events", type=int, default=200_000)
    return p


def config_from_args(a: argparse.Namespace) -> BenchConfig:
    mode = "compare" if a.compare else a.mode
    duration, requests = a.duration, a.requests
    if not duration and not requests and mode != "selftest":
        duration = 10.0
    targets = tuple(x.strip() for x in a.targets.split(",") if x.strip())
    unknown = [x for x in targets if x not in OVERHEAD_TARGETS]
    if unknown or not targets:
        raise SystemExit(f"--targets: {unknown or a.targets!r}; pick from {OVERHEAD_TARGETS}")
    routing_targets = tuple(x.strip() for x in a.routing_targets.split(",") if x.strip())
    bad = [x for x in routing_targets if x not in ROUTING_TARGETS]
    if bad or not routing_targets:
        raise SystemExit(f"--routing-targets: {bad or a.routing_targets!r}; of {ROUTING_TARGETS}")
    watch = []
    for item in a.watch_pid:
        label, _, pid = item.rpartition("=")
        watch.append((label or f"pid{pid}", int(pid)))
    return BenchConfig(
        mode=mode,
        target=TargetConfig(
            kind=a.target,
            url=a.url,
            address=a.address,
            model=a.model,
            api_key=a.api_key,
            stamp=a.stamp,
            grpc_channels=a.grpc_channels,
            timeout_s=a.timeout,
        ),
        load=LoadConfig(
            concurrency=a.concurrency,
            rate=a.rate,
            max_concurrency=a.max_concurrency,
            duration_s=duration,
            requests=requests,
            warmup=a.warmup,
            ramp=a.ramp,
            drain_timeout_s=a.drain_timeout,
            seed=a.seed,
        ),
        workload=WorkloadConfig(
            prompt_tokens=a.prompt_tokens,
            prompt_spread=a.prompt_spread,
            output_tokens=a.output_tokens,
            output_spread=a.output_spread,
            ignore_eos=not a.no_ignore_eos,
            temperature=a.temperature,
            api=a.api,
            seed=a.seed,
            kind=a.workload,
            users=a.users,
            turns=a.turns,
            system_prompts=a.system_prompts,
            system_tokens=a.system_tokens,
            session_user=a.session_user,
        ),
        output=OutputConfig(
            out_dir=Path(a.out), name=a.name, plot=not a.no_plot, progress=not a.no_progress
        ),
        overhead=OverheadConfig(
            targets=targets,
            worker=a.worker,
            edge=a.edge,
            sim_ttft_s=a.sim_ttft,
            sim_token_delay_s=a.sim_token_delay,
            worker_args=tuple(a.worker_arg),
            edge_args=tuple(a.edge_arg),
            router_args=tuple(a.router_arg),
        ),
        routing=RoutingBenchConfig(
            targets=routing_targets,
            workers=max(1, a.routing_workers),
            prefill_rate=a.sim_prefill_rate,
            kv_tokens=a.sim_kv_tokens,
            worker_args=tuple(a.worker_arg),
            edge_args=tuple(a.edge_arg),
            router_args=tuple(a.router_arg),
        ),
        compare=CompareConfig(
            targets=tuple(a.compare or ()),
            model_dir=a.model_dir,
            engine=EngineSettings(
                max_model_len=a.max_model_len,
                max_num_seqs=a.max_num_seqs,
                gpu_memory_utilization=a.gpu_memory_utilization,
                kv_cache_gb=a.kv_cache_gb,
                enforce_eager=a.enforce_eager,
            ),
            one_at_a_time=a.one_at_a_time,
        ),
        rounds=max(1, a.rounds),
        procs=max(1, a.procs),
        watch=tuple(watch),
        selftest_events=a.selftest_events,
    )
