"""The processes under test: started on 127.0.0.1, waited for, stopped by PID.

- a worker with the sim engine, an edge in front of a worker (ours: `python -m model_service`,
  `python -m edge`, both with `--port 0 --port-file`);
- a worker with the vLLM engine and vLLM's own OpenAI server, from one model directory
  with the same engine settings (`EngineSettings`), for side-by-side runs;
- vLLM's own gRPC server (`vllm.entrypoints.launchers.grpc_server`, the `[bench]` extra's
  `smg-grpc-servicer`), the engine behind SMG's gRPC router.

The peers in front of these (vllm-router, SMG) are in `peers.py`; `procwatch.ProcWatch`
measures them all while a benchmark runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scripts.bench.openai_driver import get_json
from sluice_common.options import option

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Proc:
    """A process we started, with the port it serves on."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    port: int = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (the servers drain), then SIGKILL if it takes longer than `timeout`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Engine settings given identically to our vLLM worker and to vLLM's own server."""

    max_model_len: int = option(2048, "--max-model-len", "longest prompt + output, tokens")
    max_num_seqs: int = option(32, "--max-num-seqs", "sequences in a batch at most")
    gpu_memory_utilization: float = option(
        0.3, "--gpu-memory-utilization", "share of GPU memory the engine may take"
    )
    # CPU: KV cache size (both: kv_cache_memory_bytes).
    kv_cache_gb: float | None = option(None, "--kv-cache-gb", "CPU KV cache, GiB", type=float)
    dtype: str = "auto"
    # None: eager without an NVIDIA GPU (the worker's own default there; vLLM's server
    # would compile), compiled with one. Always passed explicitly to both stacks.
    enforce_eager: bool | None = option(
        None,
        "--enforce-eager",
        "eager mode (default: eager without an NVIDIA GPU)",
        action=argparse.BooleanOptionalAction,
    )
    served_name: str = ""

    @property
    def eager(self) -> bool:
        if self.enforce_eager is not None:
            return self.enforce_eager
        return not (Path("/proc/driver/nvidia").exists() or shutil.which("nvidia-smi"))

    def worker_args(self) -> list[str]:
        args = [
            f"--max-model-len={self.max_model_len}",
            f"--max-num-seqs={self.max_num_seqs}",
            f"--gpu-memory-utilization={self.gpu_memory_utilization}",
            f"--dtype={self.dtype}",
        ]
        if self.kv_cache_gb is not None:
            args.append(f"--kv-cache-space-gb={self.kv_cache_gb}")
        args.append("--enforce-eager" if self.eager else "--no-enforce-eager")
        if self.served_name:
            args.append(f"--served-model-name={self.served_name}")
        return args

    def server_args(self) -> list[str]:
        # The worker's fixed choices (model_service/engines/vllm/args.py) made explicit for vLLM.
        args = [
            f"--max-model-len={self.max_model_len}",
            f"--max-num-seqs={self.max_num_seqs}",
            f"--gpu-memory-utilization={self.gpu_memory_utilization}",
            f"--dtype={self.dtype}",
            "--enable-prefix-caching",
            "--disable-log-stats",
        ]
        if self.kv_cache_gb is not None:
            args.append(f"--kv-cache-memory-bytes={int(self.kv_cache_gb * 2**30)}")
        if self.eager:
            args.append("--enforce-eager")
        if self.served_name:
            args.append(f"--served-model-name={self.served_name}")
        return args


def spawn(name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
    """`argv` started in the repository root, its output to a log file of its own."""
    tmp = Path(tempfile.mkdtemp(prefix=f"sluice-bench-{name}-"))
    log_path = tmp / "log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    return Proc(name, proc, log_path)


def wait_ready(proc: Proc, ready, timeout: float) -> Proc:  # type: ignore[no-untyped-def]
    """Poll `ready()` until true; fail with the log's tail if the process dies or hangs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise RuntimeError(
                f"{proc.name} exited with {proc.proc.returncode}:\n{proc.log_tail()}"
            )
        try:
            if ready():
                return proc
        except (OSError, ValueError, grpc.RpcError, TimeoutError):
            pass
        time.sleep(0.2)
    proc.stop(5)
    raise RuntimeError(f"{proc.name} not ready after {timeout:.0f}s:\n{proc.log_tail()}")


def port_file_ready(proc: Proc, port_file: Path) -> bool:
    text = port_file.read_text().strip() if port_file.exists() else ""
    if text:
        proc.port = int(text)
    return bool(text)


def serving(address: str) -> bool:
    with grpc.insecure_channel(address) as ch:
        resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
    return resp.status == health_pb2.HealthCheckResponse.SERVING


def models_ready(port: int) -> bool:
    data = asyncio.run(get_json("127.0.0.1", port, "/v1/models", timeout=2)).get("data")
    return bool(data)


def start_worker(engine_args: list[str], name: str = "worker", timeout: float = 60.0) -> Proc:
    """`python -m model_service ENGINE_ARGS` on a free port, waited until SERVING."""
    port_file = Path(tempfile.mkdtemp(prefix="sluice-bench-port-")) / "port"
    proc = spawn(
        name,
        [sys.executable, "-m", "model_service", "--host", "127.0.0.1", "--port", "0",
         "--port-file", str(port_file), *engine_args],
    )  # fmt: skip
    wait_ready(proc, lambda: port_file_ready(proc, port_file), timeout)
    return wait_ready(proc, lambda: serving(proc.address), timeout)


def start_sim_worker(extra: list[str], timeout: float = 60.0) -> Proc:
    return start_worker(["--engine", "sim", *extra], "sim-worker", timeout)


def start_vllm_worker(model_dir: str, engine: EngineSettings, timeout: float = 900.0) -> Proc:
    args = ["--engine", "vllm", "--model", model_dir, *engine.worker_args()]
    return start_worker(args, "vllm-worker", timeout)


def start_edge(
    worker_address: str | list[str],
    extra: list[str],
    timeout: float = 60.0,
    name: str = "edge",
    env: dict[str, str] | None = None,
) -> Proc:
    """`python -m edge --worker ADDR...` on a free port, waited until it lists the model."""
    if not (ROOT / "edge" / "__main__.py").exists():
        raise RuntimeError("edge/__main__.py does not exist yet: no edge to start")
    port_file = Path(tempfile.mkdtemp(prefix="sluice-bench-port-")) / "port"
    workers = [worker_address] if isinstance(worker_address, str) else worker_address
    proc = spawn(
        name,
        [sys.executable, "-m", "edge", *(f"--worker={w}" for w in workers), "--host", "127.0.0.1",
         "--port", "0", "--port-file", str(port_file), *extra],
        env,
    )  # fmt: skip
    wait_ready(proc, lambda: port_file_ready(proc, port_file), timeout)
    return wait_ready(proc, lambda: models_ready(proc.port), timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_vllm_server(model_dir: str, engine: EngineSettings, timeout: float = 900.0) -> Proc:
    """vLLM's own OpenAI server (`python -m vllm.entrypoints.openai.api_server`)."""
    port = free_port()
    proc = spawn(
        "vllm-server",
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
         "--host", "127.0.0.1", f"--port={port}", *engine.server_args()],
    )  # fmt: skip
    proc.port = port
    return wait_ready(proc, lambda: models_ready(port), timeout)


def start_vllm_grpc_server(model_dir: str, engine: EngineSettings, timeout: float = 900.0) -> Proc:
    """vLLM's own gRPC server (`python -m vllm.entrypoints.launchers.grpc_server`, SMG's
    `VllmEngine` contract from `smg-grpc-servicer`), waited until its health says SERVING.

    It takes vLLM's engine flags, so it gets the same settings as vLLM's OpenAI server."""
    port = free_port()
    proc = spawn(
        "vllm-grpc-server",
        [sys.executable, "-m", "vllm.entrypoints.launchers.grpc_server", "--model", model_dir,
         "--host", "127.0.0.1", f"--port={port}", *engine.server_args()],
    )  # fmt: skip
    proc.port = port
    return wait_ready(proc, lambda: serving(proc.address), timeout)
