"""Processes that compile constraints (`child.py`), each bounded in time and memory.

A job takes an idle child, or waits for one (at most `wait_s`: then RESOURCE_EXHAUSTED);
a child that runs past `limit_s`, or whose caller left (the task cancelled), is killed and
replaced in the background, so a compile never outlives its bound or its caller. A child
that died compiling ran out of its address space (or crashed): the job's verdict is
`memory`. Children fork from multiprocessing's fork server, which imports xgrammar (and
torch with it) once: a replacement is ready in milliseconds, not the seconds of a start."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from model_service.constraints import child
from model_service.errors import Overloaded
from model_service.types import CompileJob

log = logging.getLogger("sluice.constraints")

START_S = 60.0  # a child's start (the fork server's own start, the first time)
RESPAWN_PAUSE_S = 1.0  # after a child failed to start
CONTEXT = multiprocessing.get_context("forkserver")
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True, slots=True)
class Verdict:
    """A compile's outcome: `ok`, `error` (the backend refused it, `message` says why),
    `slow` (over the time bound) or `memory` (over the memory bound). A slow one carries the
    CPU seconds its child had meanwhile (None where unknown): under the bound, the machine
    was busy, and the constraint may not be dear."""

    kind: str
    seconds: float = 0.0
    message: str = ""
    cpu_s: float | None = None


def _cpu_s(pid: int) -> float | None:
    """A process's CPU seconds so far, user and system (None where unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS
    except (OSError, IndexError, ValueError):
        return None


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Child:
    """One compiler process and our end of its pipe."""

    __slots__ = ("conn", "proc")

    def __init__(self, proc: Any, conn: Connection) -> None:
        self.proc = proc
        self.conn = conn

    async def recv(self, timeout: float) -> bytes:
        """The next message; b"" when the child died (TimeoutError past `timeout`)."""
        loop = asyncio.get_running_loop()
        readable = loop.create_future()
        fd = self.conn.fileno()
        loop.add_reader(fd, _resolve, readable)
        try:
            await asyncio.wait_for(readable, timeout)
        finally:
            loop.remove_reader(fd)
        try:
            return self.conn.recv_bytes()
        except (EOFError, OSError):
            return b""

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.kill()
        self.conn.close()


class CompilerPool:
    """`slots` compilers over one vocabulary (`xgrammar.TokenizerInfo.serialize_json`);
    `start()` spawns them, `close()` ends them."""

    def __init__(self, vocab: str, slots: int, limit_s: float, limit_mb: int) -> None:
        self.vocab = vocab
        self.vocab_path = ""
        self._vocab_file: Any = None
        self.limit_s = limit_s
        self.limit_mb = limit_mb
        self.slots = slots
        self.wait_s = 2 * limit_s + START_S  # a busy compile, then a (first) start
        self.busy: set[int] = set()  # the pids of children compiling now
        self._idle: asyncio.Queue[_Child] = asyncio.Queue()
        self._children: set[_Child] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def start(self) -> None:
        # A file with no name, read by the children through this process's descriptor:
        # nothing is left in /tmp however this process ends (SIGKILL, OOM).
        f = tempfile.TemporaryFile("w+")
        f.write(self.vocab)
        f.flush()
        self._vocab_file = f
        self.vocab_path = f"/proc/{os.getpid()}/fd/{f.fileno()}"
        CONTEXT.set_forkserver_preload(["xgrammar"])  # when it is not running yet
        for _ in range(self.slots):
            self._respawn()

    @property
    def pids(self) -> list[int]:
        """The live children's process ids."""
        return sorted(c.proc.pid for c in self._children if c.proc.is_alive())

    async def compile(self, job: CompileJob) -> Verdict:
        """Compile `job` in a child. Raises Overloaded when no child frees up in time."""
        worker = await self._take()
        line = json.dumps(
            {"method": job.method, "spec": job.spec, "any_whitespace": job.any_whitespace}
        )
        started = time.monotonic()
        raw = b""
        pid = worker.proc.pid
        self.busy.add(pid)
        cpu = _cpu_s(pid)
        try:
            # From a thread: a spec over the pipe's buffer waits for the idle child to read.
            await asyncio.to_thread(worker.conn.send_bytes, line.encode())
            raw = await worker.recv(self.limit_s)
        except TimeoutError:
            now = _cpu_s(pid)
            used = None if cpu is None or now is None else now - cpu
            return Verdict("slow", time.monotonic() - started, cpu_s=used)
        except OSError:  # it died before it read the job
            raw = b""
        finally:
            self.busy.discard(pid)
            if raw:
                self._idle.put_nowait(worker)
            else:  # over time, died, or its caller left: it is in an unknown state
                self._retire(worker)
        took = time.monotonic() - started
        if not raw:
            return Verdict("memory", took)
        reply = json.loads(raw)
        if reply.get("ok"):
            return Verdict("ok", took)
        if reply.get("memory"):
            return Verdict("memory", took)
        return Verdict("error", took, str(reply.get("error", "")))

    async def _take(self) -> _Child:
        """An idle child; one handed over as the caller left goes back, never lost."""
        getter = asyncio.ensure_future(self._idle.get())
        try:
            return await asyncio.wait_for(asyncio.shield(getter), self.wait_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if getter.done() and not getter.cancelled():
                self._idle.put_nowait(getter.result())
            getter.cancel()
            if isinstance(exc, TimeoutError):
                raise Overloaded(
                    "every constraint compiler of this worker is busy", retry_after_s=1.0
                ) from None
            raise

    def _retire(self, worker: _Child) -> None:
        self._children.discard(worker)
        worker.kill()
        self._respawn()

    def _respawn(self, pause_s: float = 0.0) -> None:
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._spawn(pause_s))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _spawn(self, pause_s: float) -> None:
        if pause_s:
            await asyncio.sleep(pause_s)
        mine, theirs = CONTEXT.Pipe()
        proc = CONTEXT.Process(
            target=child.serve, args=(theirs, self.vocab_path, self.limit_mb), daemon=True
        )
        # The first start also starts the fork server (seconds): off the event loop.
        await asyncio.to_thread(proc.start)
        if proc.pid is not None:  # before it is listed (`pids`) or runs much
            child.background(proc.pid)
        theirs.close()
        worker = _Child(proc, mine)
        self._children.add(worker)
        try:
            ready = await worker.recv(START_S)
        except TimeoutError:
            ready = b""
        if self._closed or not ready:
            self._children.discard(worker)
            worker.kill()
            if not self._closed:
                log.error("a constraint compiler failed to start (exit %s)", proc.exitcode)
                self._respawn(RESPAWN_PAUSE_S)
            return
        self._idle.put_nowait(worker)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for worker in list(self._children):
            worker.kill()
        for worker in list(self._children):  # reaped, no zombie left
            await asyncio.to_thread(worker.proc.join, 5.0)
        self._children.clear()
        if self._vocab_file is not None:
            self._vocab_file.close()
            self._vocab_file = None
