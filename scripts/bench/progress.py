"""Live progress: one line on stderr, rewritten in place twice a second.

No dependency (tqdm would add nothing a counter line does not show). On a terminal the
line is rewritten with `\\r`; otherwise a line is printed every 5 s so logs stay readable.
"""

from __future__ import annotations

import asyncio
import sys
import time

from scripts.bench.record import RequestRecord


class Progress:
    """Counters the load generator updates, and the task that prints them."""

    def __init__(self, label: str, enabled: bool = True, total: int = 0) -> None:
        self.label = label
        self.enabled = enabled
        self.total = total
        self.inflight = 0
        self.done = 0
        self.errors = 0
        self.tokens = 0
        self._t0 = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._tty = sys.stderr.isatty()

    def started(self) -> None:
        self.inflight += 1

    def finished(self, rec: RequestRecord) -> None:
        self.inflight -= 1
        self.done += 1
        self.tokens += rec.tokens
        if rec.error:
            self.errors += 1

    def line(self) -> str:
        t = time.monotonic() - self._t0
        total = f"/{self.total}" if self.total else ""
        rate = self.tokens / t if t > 0 else 0.0
        return (
            f"[{self.label} {t:6.1f}s] done {self.done}{total}  err {self.errors}  "
            f"in-flight {self.inflight}  tokens {self.tokens}  ({rate:,.0f} tok/s)"
        )

    def start(self) -> None:
        self._t0 = time.monotonic()
        if self.enabled:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self.enabled:
            self._write(self.line(), final=True)

    async def _run(self) -> None:
        period = 0.5 if self._tty else 5.0
        while True:
            await asyncio.sleep(period)
            self._write(self.line())

    def _write(self, text: str, final: bool = False) -> None:
        if self._tty:
            sys.stderr.write("\r\x1b[K" + text + ("\n" if final else ""))
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()
