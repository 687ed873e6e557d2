"""A real redis-server for tests: started on a free 127.0.0.1 port in a temporary
directory, no persistence, stopped and restarted by its own PID (the failure tests stop
it mid-load and bring it back on the same port), killed -9, frozen and thawed."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.waits import eventually

INSTALL = "scripts/deploy/install_redis.sh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server process (see the module docstring)."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not Path(binary).exists():
            raise RuntimeError(f"redis-server missing: run {INSTALL}")
        self.binary = binary
        self.dir = Path(tempfile.mkdtemp(prefix="sluice-redis-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--dir", str(self.dir)]
        with open(self.dir / "log", "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        proc = self.proc

        def answers() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited:\n{(self.dir / 'log').read_text()}")
            return _ping(self.port)

        try:
            eventually(answers, what=f"redis-server answers on {self.port}", timeout=timeout)
        except AssertionError:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM, wait; SIGKILL if it lingers. Its port is closed when this returns."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def kill(self) -> None:
        """SIGKILL, as a crash: no goodbye to its clients. Its port is closed on return."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def freeze(self) -> None:
        """SIGSTOP: connections stay open, nothing answers (a stalled server)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT: it runs what waited in its sockets, then answers again."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


@contextmanager
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
