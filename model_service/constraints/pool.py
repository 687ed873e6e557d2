"""Child processes that compile constraints (`child.py`), each bounded in time and memory.

A job takes an idle child, or waits for one (at most `wait_s`: then RESOURCE_EXHAUSTED);
a child that runs past `limit_s`, or whose caller left (the task cancelled), is killed and
replaced in the background, so a compile never outlives its bound or its caller. A child
that died compiling ran out of its address space (or crashed): the job's verdict is
`memory`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from model_service.constraints import child
from model_service.errors import Overloaded
from model_service.types import CompileJob

log = logging.getLogger("sluice.constraints")

START_S = 60.0  # a child's start: imports xgrammar (and torch), loads the vocabulary
RESPAWN_PAUSE_S = 1.0  # after a child failed to start


@dataclass(frozen=True, slots=True)
class Verdict:
    """A compile's outcome: `ok`, `error` (the backend refused it, `message` says why),
    `slow` (over the time bound) or `memory` (over the memory bound)."""

    kind: str
    seconds: float = 0.0
    message: str = ""


class CompilerPool:
    """`slots` compilers over one vocabulary (`xgrammar.TokenizerInfo.serialize_json`);
    `start()` spawns them, `close()` ends them."""

    def __init__(self, vocab: str, slots: int, limit_s: float, limit_mb: int) -> None:
        self.vocab = vocab
        self.vocab_path = ""
        self.limit_s = limit_s
        self.limit_mb = limit_mb
        self.slots = slots
        self.wait_s = 2 * limit_s + START_S  # a busy compile, then a respawn
        self._idle: asyncio.Queue[asyncio.subprocess.Process] = asyncio.Queue()
        self._procs: set[asyncio.subprocess.Process] = set()
        self._spawns: set[asyncio.Task[Any]] = set()
        self._closed = False

    def start(self) -> None:
        with tempfile.NamedTemporaryFile(
            "w", prefix="sluice-vocab-", suffix=".json", delete=False
        ) as f:
            f.write(self.vocab)
        self.vocab_path = f.name
        for _ in range(self.slots):
            self._respawn()

    @property
    def pids(self) -> list[int]:
        """The live children's process ids."""
        return sorted(p.pid for p in self._procs if p.returncode is None)

    async def compile(self, job: CompileJob) -> Verdict:
        """Compile `job` in a child. Raises Overloaded when no child frees up in time."""
        proc = await self._take()
        line = json.dumps(
            {"method": job.method, "spec": job.spec, "any_whitespace": job.any_whitespace}
        )
        started = time.monotonic()
        done = False
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(line.encode() + b"\n")
            await proc.stdin.drain()
            raw = await asyncio.wait_for(proc.stdout.readline(), self.limit_s)
            done = bool(raw)
        except TimeoutError:
            return Verdict("slow", time.monotonic() - started)
        except (ConnectionError, BrokenPipeError):  # it died before it read the job
            raw = b""
        finally:
            if done:
                self._idle.put_nowait(proc)
            else:  # over time, died, or its caller left: it is in an unknown state
                self._retire(proc)
        took = time.monotonic() - started
        if not raw:
            return Verdict("memory", took)
        reply = json.loads(raw)
        if reply.get("ok"):
            return Verdict("ok", took)
        if reply.get("memory"):
            return Verdict("memory", took)
        return Verdict("error", took, str(reply.get("error", "")))

    async def _take(self) -> asyncio.subprocess.Process:
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

    def _retire(self, proc: asyncio.subprocess.Process) -> None:
        self._procs.discard(proc)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        self._respawn()

    def _respawn(self, pause_s: float = 0.0) -> None:
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._spawn(pause_s))
        self._spawns.add(task)
        task.add_done_callback(self._spawns.discard)

    async def _spawn(self, pause_s: float) -> None:
        if pause_s:
            await asyncio.sleep(pause_s)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            child.__file__,  # by path: it imports nothing of ours
            self.vocab_path,
            str(self.limit_mb),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        self._procs.add(proc)
        assert proc.stdout is not None
        try:
            ready = await asyncio.wait_for(proc.stdout.readline(), START_S)
        except TimeoutError:
            ready = b""
        if self._closed or not ready:
            self._procs.discard(proc)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            if not self._closed:
                log.error("a constraint compiler failed to start (exit %s)", proc.returncode)
                self._respawn(RESPAWN_PAUSE_S)
            return
        self._idle.put_nowait(proc)
        # Reap it once it ends (killed when retired), so no zombie is left behind.
        waiter = asyncio.get_running_loop().create_task(proc.wait())
        self._spawns.add(waiter)
        waiter.add_done_callback(self._spawns.discard)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._spawns):
            task.cancel()
        for proc in list(self._procs):
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        await asyncio.gather(*(p.wait() for p in self._procs), return_exceptions=True)
        await asyncio.gather(*self._spawns, return_exceptions=True)
        self._procs.clear()
        if self.vocab_path:
            with contextlib.suppress(OSError):
                os.unlink(self.vocab_path)
