"""Rolling restart of a pool's workers, one at a time, losing no request.

    SLUICE_ADMIN_KEY=... python -m scripts.rolling_restart \\
        --edge http://127.0.0.1:8000 --pool stable \\
        --worker 10.0.0.11:50051=4242 --worker 10.0.0.12:50051=4243

For each worker, in order:
1. take it out of the pool through the edge's admin API
   (`DELETE /admin/pools/{pool}/workers/{address}`): no new request goes to it;
2. SIGTERM: the worker reports NOT_SERVING and lets its in-flight generations finish
   (its `--drain-grace`); wait for the process to exit (`--drain-timeout`, then SIGKILL);
3. start it again with the same command line, working directory and environment, read
   from `/proc/<pid>` (so this works for any worker process this user may signal), its
   output appended to the same log file;
4. wait until its grpc.health.v1 Check says SERVING (`--ready-timeout`);
5. put it back (`POST /admin/pools/{pool}/workers`) and wait until the edge reports it
   routable, before the next worker goes down.

Without `--edge` steps 1 and 5 are skipped: the edges' health Watch sees NOT_SERVING at
the SIGTERM and SERVING after the restart; `--settle` seconds are waited after each
worker instead. A worker started with `--port-file` may come back on another port (port
0): the new address is read from that file and used for step 5.

The admin key comes from `$SLUICE_ADMIN_KEY` (or `--admin-key-file`), never from the
command line. Prints one JSON line per worker: address, old and new PID, seconds taken.
Exits 1 at the first worker that fails (the rest are left alone).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scripts import options as shared
from sluice_common.options import add_section, option, section_from


@dataclass(frozen=True, slots=True)
class Options:
    edge: str | None = option(None, "--edge", "edge base URL (admin API); none: health only")
    pool: str = option("default", "--pool", "the workers' pool on the edge")
    workers: list[str] = option(
        [], "--worker", "in restart order", action="append", required=True, metavar="ADDR=PID"
    )
    admin_key_file: str = shared.admin_key_file()
    drain_timeout: float = option(60.0, "--drain-timeout", "seconds, then SIGKILL")
    ready_timeout: float = option(120.0, "--ready-timeout", "seconds to SERVING")
    settle: float = option(2.0, "--settle", "seconds after each (no --edge)")


@dataclass
class Target:
    """A worker process to restart, and how to start it again."""

    address: str
    pid: int
    command: list[str]
    cwd: str
    env: dict[str, str]
    log: str | None  # file its stdout went to, if any

    @classmethod
    def from_proc(cls, address: str, pid: int) -> Target:
        """Command line, directory, environment and log file of a running process."""
        proc = Path(f"/proc/{pid}")
        command = [a.decode() for a in proc.joinpath("cmdline").read_bytes().split(b"\0") if a]
        env = {}
        for item in proc.joinpath("environ").read_bytes().split(b"\0"):
            name, sep, value = item.decode(errors="replace").partition("=")
            if sep:
                env[name] = value
        log = os.readlink(proc / "fd" / "1")
        return cls(
            address,
            pid,
            command,
            os.readlink(proc / "cwd"),
            env,
            log if log.startswith("/") and Path(log).is_file() else None,
        )

    def port_file(self) -> Path | None:
        if "--port-file" in self.command:
            i = self.command.index("--port-file")
            if i + 1 < len(self.command):
                return Path(self.cwd, self.command[i + 1])
        return None


class Admin:
    """The edge's admin API (or nothing, without `--edge`)."""

    def __init__(self, edge: str | None, key: str, pool: str) -> None:
        self.edge = edge.rstrip("/") if edge else None
        self.pool = pool
        self.client = httpx.Client(headers={"authorization": f"Bearer {key}"}, timeout=10)

    def remove(self, address: str) -> None:
        if self.edge is None:
            return
        url = f"{self.edge}/admin/pools/{self.pool}/workers/{address}"
        resp = self.client.delete(url)
        if resp.status_code not in (200, 404):  # 404: out already
            raise RuntimeError(f"removing {address}: {resp.status_code} {resp.text}")

    def add(self, address: str, timeout: float) -> None:
        if self.edge is None:
            return
        url = f"{self.edge}/admin/pools/{self.pool}/workers"
        resp = self.client.post(url, json={"address": address})
        if resp.status_code not in (201, 409):  # 409: in already
            raise RuntimeError(f"adding {address}: {resp.status_code} {resp.text}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pool = self.client.get(f"{self.edge}/admin/pools/{self.pool}").json()
            if any(w["address"] == address and w["routable"] for w in pool["workers"]):
                return
            time.sleep(0.05)
        raise RuntimeError(f"the edge does not route to {address} after {timeout}s")


def alive(pid: int) -> bool:
    """Running (a zombie, exited but not yet reaped by its parent, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop(pid: int, timeout: float) -> None:
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
        time.sleep(0.02)


def start(target: Target, timeout: float) -> tuple[subprocess.Popen[bytes], str]:
    """Start the worker again; (process, address it listens on)."""
    port_file = target.port_file()
    if port_file is not None:
        port_file.unlink(missing_ok=True)
    out = open(target.log, "ab") if target.log else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(
            target.command,
            cwd=target.cwd,
            env=target.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives this script
        )
    finally:
        if target.log:
            out.close()  # type: ignore[union-attr]
    address = target.address
    if port_file is not None:
        deadline = time.monotonic() + timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not write {port_file}")
            time.sleep(0.02)
        address = f"{address.rsplit(':', 1)[0]}:{int(port_file.read_text())}"
    return proc, address


def wait_serving(address: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"worker at {address} exited with {proc.returncode}")
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.05)
    raise RuntimeError(f"worker at {address} not SERVING after {timeout}s")


def restart(target: Target, admin: Admin, opts: Options) -> dict[str, object]:
    t0 = time.monotonic()
    admin.remove(target.address)
    stop(target.pid, opts.drain_timeout)
    drained = time.monotonic()
    proc, address = start(target, opts.ready_timeout)
    wait_serving(address, proc, opts.ready_timeout)
    admin.add(address, opts.ready_timeout)
    if admin.edge is None:
        time.sleep(opts.settle)
    return {
        "address": address,
        "old_pid": target.pid,
        "new_pid": proc.pid,
        "drain_s": round(drained - t0, 3),
        "total_s": round(time.monotonic() - t0, 3),
    }


def parse_args(argv: list[str] | None) -> Options:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_section(p, "restart", Options)
    return section_from(p.parse_args(argv), "restart", Options)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    key = Path(opts.admin_key_file).read_text().strip() if opts.admin_key_file else ""
    key = key or os.environ.get(shared.ADMIN_KEY_ENV, "")
    if opts.edge and not key:
        env = shared.ADMIN_KEY_ENV
        print(f"--edge needs the admin key (${env} or --admin-key-file)", file=sys.stderr)
        return 2
    targets = []
    for spec in opts.workers:
        address, _, pid = spec.rpartition("=")
        if not address or not pid.isdigit() or not alive(int(pid)):
            print(f"--worker {spec}: want ADDR=PID of a running process", file=sys.stderr)
            return 2
        targets.append(Target.from_proc(address, int(pid)))
    admin = Admin(opts.edge, key, opts.pool)
    for target in targets:
        try:
            print(json.dumps(restart(target, admin, opts)), flush=True)
        except (RuntimeError, OSError, httpx.HTTPError) as exc:
            print(f"restarting {target.address} failed: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
