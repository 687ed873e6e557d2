"""The processes under test: started on 127.0.0.1, waited for, watched, stopped by PID.

- a worker with the sim engine, an edge in front of a worker (ours: `python -m model_service`,
  `python -m edge`, both with `--port 0 --port-file`);
- a worker with the vLLM engine and vLLM's own OpenAI server, from one model directory
  with the same engine settings (`EngineSettings`), for side-by-side runs.

`ProcWatch` samples resident memory and CPU time of each process tree (vLLM runs its
engine core in a child process) while a benchmark runs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scripts.bench.openai_driver import get_json

ROOT = Path(__file__).resolve().parents[2]
CLK_TCK = os.sysconf("SC_CLK_TCK")


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

    max_model_len: int = 2048
    max_num_seqs: int = 32
    gpu_memory_utilization: float = 0.3
    kv_cache_gb: float | None = None  # CPU: KV cache size (both: kv_cache_memory_bytes)
    dtype: str = "auto"
    # None: eager without an NVIDIA GPU (the worker's own default there; vLLM's server
    # would compile), compiled with one. Always passed explicitly to both stacks.
    enforce_eager: bool | None = None
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
        # The worker's fixed choices (vllm_args.build_engine_args) made explicit for vLLM.
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


def _spawn(name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
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


def _wait(proc: Proc, ready, timeout: float) -> Proc:  # type: ignore[no-untyped-def]
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


def _port_file_ready(proc: Proc, port_file: Path) -> bool:
    text = port_file.read_text().strip() if port_file.exists() else ""
    if text:
        proc.port = int(text)
    return bool(text)


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as ch:
        resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
    return resp.status == health_pb2.HealthCheckResponse.SERVING


def _models_ready(port: int) -> bool:
    data = asyncio.run(get_json("127.0.0.1", port, "/v1/models", timeout=2)).get("data")
    return bool(data)


def start_worker(engine_args: list[str], name: str = "worker", timeout: float = 60.0) -> Proc:
    """`python -m model_service ENGINE_ARGS` on a free port, waited until SERVING."""
    port_file = Path(tempfile.mkdtemp(prefix="sluice-bench-port-")) / "port"
    proc = _spawn(
        name,
        [sys.executable, "-m", "model_service", "--host", "127.0.0.1", "--port", "0",
         "--port-file", str(port_file), *engine_args],
    )  # fmt: skip
    _wait(proc, lambda: _port_file_ready(proc, port_file), timeout)
    return _wait(proc, lambda: _serving(proc.address), timeout)


def start_sim_worker(extra: list[str], timeout: float = 60.0) -> Proc:
    return start_worker(["--engine", "sim", *extra], "sim-worker", timeout)


def start_vllm_worker(model_dir: str, engine: EngineSettings, timeout: float = 900.0) -> Proc:
    args = ["--engine", "vllm", "--model", model_dir, *engine.worker_args()]
    return start_worker(args, "vllm-worker", timeout)


def start_edge(worker_address: str, extra: list[str], timeout: float = 60.0) -> Proc:
    """`python -m edge --worker ADDR` on a free port, waited until it lists the model."""
    if not (ROOT / "edge" / "__main__.py").exists():
        raise RuntimeError("edge/__main__.py does not exist yet: no edge to start")
    port_file = Path(tempfile.mkdtemp(prefix="sluice-bench-port-")) / "port"
    proc = _spawn(
        "edge",
        [sys.executable, "-m", "edge", "--worker", worker_address, "--host", "127.0.0.1",
         "--port", "0", "--port-file", str(port_file), *extra],
    )  # fmt: skip
    _wait(proc, lambda: _port_file_ready(proc, port_file), timeout)
    return _wait(proc, lambda: _models_ready(proc.port), timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_vllm_server(model_dir: str, engine: EngineSettings, timeout: float = 900.0) -> Proc:
    """vLLM's own OpenAI server (`python -m vllm.entrypoints.openai.api_server`)."""
    port = free_port()
    proc = _spawn(
        "vllm-server",
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
         "--host", "127.0.0.1", f"--port={port}", *engine.server_args()],
    )  # fmt: skip
    proc.port = port
    return _wait(proc, lambda: _models_ready(port), timeout)


def _tree(pid: int) -> list[int]:
    """pid and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def _sample(pid: int) -> tuple[int, float]:
    """(resident KiB, CPU seconds) of one process; zeros if it is gone."""
    try:
        rss = 0
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return rss, (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0, 0.0


class ProcWatch:
    """Samples RSS and CPU of process trees in a thread; `stop()` returns the figures."""

    def __init__(self, pids: dict[str, int], period_s: float = 0.5) -> None:
        self.pids = pids
        self.period_s = period_s
        self._first: dict[str, tuple[int, float]] = {}
        self._last: dict[str, tuple[int, float]] = {}
        self._peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = 0.0

    def _measure(self) -> dict[str, tuple[int, float]]:
        out = {}
        for label, pid in self.pids.items():
            samples = [_sample(p) for p in _tree(pid)]
            out[label] = (sum(s[0] for s in samples), sum(s[1] for s in samples))
        return out

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._first = self._last = self._measure()
        self._peak = {k: v[0] for k, v in self._first.items()}
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._last = self._measure()
            for k, (rss, _) in self._last.items():
                self._peak[k] = max(self._peak.get(k, 0), rss)

    def stop(self) -> dict[str, dict[str, float]]:
        if not self._thread.is_alive():
            return {}  # never started (the run failed before measuring)
        self._stop.set()
        self._thread.join()
        self._last = self._measure()
        wall = max(1e-9, time.monotonic() - self._t0)
        out = {}
        for label in self.pids:
            rss0, cpu0 = self._first[label]
            rss1, cpu1 = self._last[label]
            out[label] = {
                "pid": self.pids[label],
                "rss_start_mib": round(rss0 / 1024, 1),
                "rss_peak_mib": round(max(self._peak[label], rss1) / 1024, 1),
                "rss_end_mib": round(rss1 / 1024, 1),
                "cpu_s": round(cpu1 - cpu0, 2),
                "cpu_pct": round(100 * (cpu1 - cpu0) / wall, 1),
            }
        return out
