"""Start and stop real Sluice processes (worker, edge) for integration tests.

Every process is started by the test run itself on 127.0.0.1, port 0, and ended by its
own PID when the test is done.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.waits import eventually

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Proc:
    """A running process with the port it bound."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait; SIGKILL if it does not end in time. Returns the exit code.
        What it started and left behind (a killed `--processes N` edge's children, an
        engine core) is ended with it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._end_group()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._end_group()

    def _end_group(self) -> None:
        """SIGKILL what is left of its process group (it leads one: `_spawn`)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _spawn(
    module: str, args: list[str], startup_timeout: float, env: dict[str, str] | None
) -> Proc:
    tmp = Path(tempfile.mkdtemp(prefix=f"sluice-{module}-"))
    port_file = tmp / "port"
    log_path = tmp / "log"
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, "--port", "0", "--port-file", str(port_file), *args],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,  # its own process group: `Proc` ends what it leaves
        )

    def bound_port() -> int:
        if proc.poll() is not None:
            raise RuntimeError(f"{module} exited with {proc.returncode}:\n{log_path.read_text()}")
        text = port_file.read_text().strip() if port_file.exists() else ""
        return int(text) if text else 0

    try:
        port = eventually(bound_port, what=f"{module} binds a port", timeout=startup_timeout)
    except BaseException as err:  # Ctrl-C and a failed start too: none left running
        Proc(proc, 0, log_path).kill()
        if isinstance(err, AssertionError):
            raise RuntimeError(f"{err}:\n{log_path.read_text()}") from None
        raise
    return Proc(proc, port, log_path)


def wait_serving(address: str, timeout: float = 60.0) -> None:
    """Block until the worker's grpc.health.v1 reports SERVING."""
    serving = health_pb2.HealthCheckResponse.SERVING
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        eventually(
            lambda: stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0).status == serving,
            what=f"the worker at {address} is SERVING",
            timeout=timeout,
            ignore=(grpc.RpcError,),
        )


def start_worker(
    *args: str, startup_timeout: float = 60.0, wait: bool = True, env: dict[str, str] | None = None
) -> Proc:
    """Start `python -m model_service ARGS` and, by default, wait until it is SERVING."""
    proc = _spawn("model_service", list(args), startup_timeout, env)
    if wait:
        try:
            wait_serving(proc.address, startup_timeout)
        except BaseException:
            proc.kill()
            raise
    return proc


@contextmanager
def worker(*args: str, **kwargs: object) -> Iterator[Proc]:
    """A worker for the duration of a with-block."""
    proc = start_worker(*args, **kwargs)  # type: ignore[arg-type]
    try:
        yield proc
    finally:
        proc.kill()


def start_edge(
    *args: str, startup_timeout: float = 30.0, env: dict[str, str] | None = None
) -> Proc:
    """Start `python -m edge ARGS` (it must accept --port 0 and --port-file)."""
    return _spawn("edge", list(args), startup_timeout, env)
