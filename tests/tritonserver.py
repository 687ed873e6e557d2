"""Start and stop a real NVIDIA Triton Inference Server for the `triton` tests.

The binary and its Python backend come from PyPI's `nvidia-pytriton` (installed by `make
setup`, see scripts/setup.sh); the model repository is tests/triton_repo. Triton wants
the Python backend's stub beside the backend library, so each server gets a backend
directory of its own in a temporary folder. The stub runs an isolated interpreter built
against numpy 1.x: it imports numpy from the venv's `triton-stub-site` (setup.sh puts
numpy<2 there, apart from the venv's own numpy 2).

Bound to 127.0.0.1 on free ports; ended by its own PID (its stub processes are children in
its own process group, ended with it).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.waits import eventually

ROOT = Path(__file__).resolve().parent.parent
REPO = ROOT / "tests" / "triton_repo"
MODEL = "sluice_sim"


def _site() -> Path:
    """site-packages holding nvidia-pytriton (found, not imported: only its binaries count)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("nvidia-pytriton is not installed: run `make setup`")
    return Path(next(iter(spec.submodule_search_locations))).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Triton:
    """A running tritonserver: its ports, its event log (the test model writes it)."""

    proc: subprocess.Popen[bytes]
    grpc_port: int
    http_port: int
    metrics_port: int
    events_path: Path
    log_path: Path

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def events(self) -> list[str]:
        if not self.events_path.exists():
            return []
        return self.events_path.read_text().splitlines()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the server and its stubs (its own process group), then reap it."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def backend_dir(tmp: Path) -> Path:
    """A backend directory with the Python backend and its stub for Python 3.11."""
    server = _site() / "pytriton" / "tritonserver"
    python = tmp / "backends" / "python"
    python.mkdir(parents=True)
    for f in (server / "backends" / "python").iterdir():
        if f.is_file():
            shutil.copy2(f, python / f.name)
    shutil.copy2(server / "python_backend_stubs" / "3.11" / "triton_python_backend_stub", python)
    return tmp / "backends"


def start_triton(
    repo: Path = REPO,
    wait: bool = True,
    timeout: float = 60.0,
    grpc_port: int = 0,
    extra: tuple[str, ...] = (),
) -> Triton:
    """Start tritonserver on free 127.0.0.1 ports (gRPC on `grpc_port` if given, `extra`
    flags added); by default wait until its model is ready."""
    site = _site()
    stub_site = Path(sys.prefix) / "triton-stub-site"
    if not (stub_site / "numpy").is_dir():
        raise RuntimeError(f"{stub_site} has no numpy for Triton's Python stub: run `make setup`")
    tmp = Path(tempfile.mkdtemp(prefix="sluice-triton-"))
    ports = [grpc_port or _free_port(), _free_port(), _free_port()]
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(site / "nvidia_pytriton.libs"),
        "SLUICE_TRITON_SITE": str(stub_site),
        "SLUICE_TRITON_EVENTS": str(tmp / "events"),
    }
    args = [
        str(site / "pytriton" / "tritonserver" / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        f"--backend-directory={backend_dir(tmp)}",
        "--grpc-address=127.0.0.1",
        "--http-address=127.0.0.1",
        f"--grpc-port={ports[0]}",
        f"--http-port={ports[1]}",
        f"--metrics-port={ports[2]}",
        "--allow-metrics=true",
        "--exit-timeout-secs=2",
        *extra,
    ]
    log_path = tmp / "log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    triton = Triton(proc, *ports, tmp / "events", log_path)
    if wait:
        try:
            wait_model_ready(triton, timeout)
        except BaseException:
            triton.kill()
            raise
    return triton


def wait_model_ready(triton: Triton, timeout: float = 60.0) -> None:
    """Until Triton's HTTP readiness endpoint says the test model is ready."""
    import httpx

    url = f"http://127.0.0.1:{triton.http_port}/v2/models/{MODEL}/ready"

    def ready() -> bool:
        if triton.proc.poll() is not None:
            raise RuntimeError(
                f"tritonserver exited with {triton.proc.returncode}:\n{triton.log()}"
            )
        return httpx.get(url, timeout=1).status_code == 200

    eventually(
        ready,
        what=f"Triton's model {MODEL} is ready",
        timeout=timeout,
        ignore=(httpx.HTTPError,),
        detail=triton.log,
    )


def wait_event(triton: Triton, line: str, timeout: float = 10.0) -> None:
    """Until the test model has written `line` to its event log."""
    eventually(
        lambda: line in triton.events(),
        what=f"{line!r} in Triton's events",
        timeout=timeout,
        detail=triton.events,
    )
