"""The harness's options: one dataclass per concern, each field declared with its flag.

`build_parser` makes the parser from the declarations (`sluice_common.options`), one
`--help` group per section, and `config_from_args` builds the `BenchConfig` back. Load,
workload and engine settings are declared with the code that reads them (`load`,
`workload`, `stacks`). Settled after parsing: no bound means 10 s, `--seed` seeds the load
too, `--compare A B` means compare mode; routing mode's stacks take overhead's sim and
extra-flag options.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from scripts import options as shared
from scripts.bench.load import LoadConfig
from scripts.bench.stacks import EngineSettings
from scripts.bench.workload import WorkloadConfig
from sluice_common.options import add_section, option, section_from

DEFAULT_MODEL_DIR = os.environ.get(
    "SLUICE_MODEL_DIR", str(Path.home() / ".cache/sluice/models/SmolLM2-135M-Instruct")
)
MODES = ("run", "overhead", "compare", "routing", "decision", "selftest")
DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_ADDRESS = "127.0.0.1:50051"
# grpc: the worker directly; sse: through the edge; router: through vllm-router -> edge;
# smg: through SGLang's gateway -> edge.
OVERHEAD_TARGETS = ("grpc", "sse", "router", "smg")
# routing mode (scripts/bench/routing.py): our edge's policies and vllm-router's cache_aware.
ROUTING_TARGETS = (
    "cache_aware", "kv_aware", "session", "session-key", "least_load", "random", "router",
    "cache_aware-x2", "kv_aware-x2",
)  # fmt: skip


# A routing target `kv_aware@N`: kv_aware with `--kv-load-slack N` (slacks side by side).
SLACK_MARK = "@"


def names_of(allowed: tuple[str, ...]) -> Any:
    """An argparse type: comma-separated names, each one of `allowed`, as a tuple."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(x.strip() for x in text.split(",") if x.strip())
        unknown = [x for x in names if x.split(SLACK_MARK)[0] not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"{unknown or text!r}; pick from {allowed}")
        return names

    return parse


def sizes(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated positive integers, as a tuple."""
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: each at least 1")
    return values


def watch_pid(text: str) -> tuple[str, int]:
    """`LABEL=PID` (or `PID`: labelled pidPID) as (label, pid)."""
    label, _, pid = text.rpartition("=")
    try:
        return label or f"pid{pid}", int(pid)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want LABEL=PID") from None


@dataclass(frozen=True, slots=True)
class TargetConfig:
    """Where `run` mode sends requests, and how."""

    kind: str = option(
        "sse",
        "--target",
        "sse: any OpenAI-compatible server; grpc: a worker",
        choices=("sse", "grpc"),
    )
    url: str = option(DEFAULT_URL, "--url", "base URL of an OpenAI-compatible server")
    address: str = option(DEFAULT_ADDRESS, "--address", "worker host:port (grpc)")
    model: str = option("", "--model", "model name (default: the server's first)")
    api_key: str = option("", "--api-key", "Bearer key for the server")
    stamp: bool | None = option(
        None,
        "--stamp",
        "ask for worker time stamps (default: on in overhead mode)",
        action=argparse.BooleanOptionalAction,
    )
    accept_gzip: bool = option(
        False,
        "--accept-gzip",
        "sse: send Accept-Encoding: gzip (as browsers and the SDKs do); bytes counted as received",
        action="store_true",
    )
    grpc_channels: int = option(1, "--grpc-channels", "grpc: channels the streams share")
    timeout_s: float = option(600.0, "--timeout", "per request, seconds")


@dataclass(frozen=True, slots=True)
class OverheadConfig:
    """Transport-only stacks on the sim engine: which targets (overhead mode), and the
    sim settings and extra flags every stack the harness starts gets (routing mode too)."""

    targets: tuple[str, ...] = option(
        ("grpc", "sse"),
        "--targets",
        "comma-separated: grpc, sse (edge), router (vllm-router+edge), smg (SMG+edge)",
        type=names_of(OVERHEAD_TARGETS),
    )
    worker: str = option("", "--worker", "use this sim worker instead of starting one")
    edge: str = option("", "--edge", "use this edge URL instead of starting one")
    sim_ttft_s: float = option(0.0, "--sim-ttft", "sim worker: seconds to the first token")
    sim_token_delay_s: float = option(0.0, "--sim-token-delay", "sim worker: s between tokens")
    worker_args: tuple[str, ...] = shared.worker_args()
    edge_args: tuple[str, ...] = option(
        (), "--edge-arg", "extra edge flag (repeat)", action="append"
    )
    router_args: tuple[str, ...] = option(
        (),
        "--router-arg",
        "extra vllm-router flag (repeat; default --policy round_robin)",
        action="append",
    )
    smg_args: tuple[str, ...] = option(
        (),
        "--smg-arg",
        "extra `smg launch` flag, both SMG stacks (repeat; default --policy round_robin)",
        action="append",
    )


@dataclass(frozen=True, slots=True)
class RoutingBenchConfig:
    """Placement policies side by side on sim workers with prefix caches (routing mode;
    the workers' sim timing and extra flags are overhead's)."""

    targets: tuple[str, ...] = option(
        ("cache_aware", "session", "random", "router"),
        "--routing-targets",
        f"comma-separated, of {', '.join(ROUTING_TARGETS)}",
        type=names_of(ROUTING_TARGETS),
    )
    workers: int = option(4, "--routing-workers", "sim workers (also decision mode's)")
    # Sim prompt tokens prefilled per second, and the sim KV cache, per worker.
    prefill_rate: float = option(20_000.0, "--sim-prefill-rate", "tokens/s")
    kv_tokens: int = option(65_536, "--sim-kv-tokens", "per worker")
    # Decision mode's size: picks per timed batch (5 batches each), prompt sizes in chars.
    decision_calls: int = option(2000, "--decision-calls", "decision mode: picks per batch")
    decision_sizes: tuple[int, ...] = option(
        (1_000, 8_000, 32_000, 128_000), "--decision-sizes", "decision mode: chars", type=sizes
    )


@dataclass(frozen=True, slots=True)
class CompareConfig:
    """Side-by-side runs of two targets, alternating (`engine`: both stacks' settings)."""

    targets: tuple[str, ...] = option(
        (),
        "--compare",
        "sluice | sluice-grpc | vllm | smg-grpc (SMG -> vLLM's gRPC server) | sse:URL | grpc:ADDR",
        type=str,
        nargs=2,
        metavar=("A", "B"),
    )
    model_dir: str = option(DEFAULT_MODEL_DIR, "--model-dir", "the model both stacks serve")
    engine: EngineSettings = field(default_factory=EngineSettings)
    one_at_a_time: bool = option(
        False,
        "--one-at-a-time",
        "run one stack at a time (when two engines do not fit)",
        action="store_true",
    )


@dataclass(frozen=True, slots=True)
class OutputConfig:
    out_dir: Path = shared.results_dir()
    name: str = option("", "--name", "result file name (default: mode-time)")
    plot: bool = option(True, "--no-plot", "no PNG plot", action="store_false")
    progress: bool = option(True, "--no-progress", "no live progress line", action="store_false")


@dataclass(frozen=True, slots=True)
class BenchConfig:
    mode: str = option("run", "--mode", "what to measure", choices=MODES)
    target: TargetConfig = field(default_factory=TargetConfig)
    load: LoadConfig = field(default_factory=LoadConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    overhead: OverheadConfig = field(default_factory=OverheadConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    routing: RoutingBenchConfig = field(default_factory=RoutingBenchConfig)
    rounds: int = shared.rounds(1, "overhead/compare/routing: alternating rounds")
    procs: int = option(1, "--procs", "harness processes sharing the load")
    # Extra processes to watch: (label, pid).
    watch: tuple[tuple[str, int], ...] = option(
        (),
        "--watch-pid",
        "also measure this process's CPU and memory (repeat)",
        action="append",
        type=watch_pid,
        metavar="LABEL=PID",
    )
    selftest_events: int = option(200_000, "--selftest-events", "selftest: events parsed")


# Section name -> (its --help group, its dataclass); BenchConfig's own flags come first.
SECTIONS: dict[str, tuple[str, Any]] = {
    "target": ("target (run mode)", TargetConfig),
    "load": ("load", LoadConfig),
    "workload": ("workload", WorkloadConfig),
    "overhead": ("overhead mode (sim engine, transport only)", OverheadConfig),
    "routing": ("routing mode (sim workers with prefix caches)", RoutingBenchConfig),
    "compare": ("compare mode", CompareConfig),
    "engine": ("compare mode: both stacks' engine", EngineSettings),
    "output": ("output", OutputConfig),
}


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults as they are typed: names comma-joined, none for an on/off switch."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if isinstance(action.default, bool) and action.nargs == 0:
            return action.help
        if isinstance(action.default, tuple) and action.default and action.help:
            return f"{action.help} (default: {','.join(map(str, action.default))})"
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench",
        description="Load generator and benchmark harness: Sluice and OpenAI-compatible servers.",
        formatter_class=DefaultsFormatter,
    )
    add_section(p, "bench", BenchConfig)
    for name, (title, cls) in SECTIONS.items():
        add_section(p.add_argument_group(title), name, cls)
    return p


def config_from_args(a: argparse.Namespace) -> BenchConfig:
    s = {name: section_from(a, name, cls) for name, (_, cls) in SECTIONS.items()}
    top = section_from(a, "bench", BenchConfig)
    compare = replace(s["compare"], targets=tuple(s["compare"].targets), engine=s["engine"])
    mode = "compare" if compare.targets else top.mode
    load: LoadConfig = replace(s["load"], seed=s["workload"].seed)
    if not load.duration_s and not load.requests and mode != "selftest":
        load = replace(load, duration_s=10.0)
    overhead: OverheadConfig = s["overhead"]
    overhead = replace(
        overhead,
        worker_args=tuple(overhead.worker_args),
        edge_args=tuple(overhead.edge_args),
        router_args=tuple(overhead.router_args),
        smg_args=tuple(overhead.smg_args),
    )
    return replace(
        top,
        mode=mode,
        target=s["target"],
        load=load,
        workload=s["workload"],
        output=s["output"],
        overhead=overhead,
        compare=compare,
        routing=replace(s["routing"], workers=max(1, s["routing"].workers)),
        rounds=max(1, top.rounds),
        procs=max(1, top.procs),
        watch=tuple(top.watch),
    )
