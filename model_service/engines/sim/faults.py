"""Faults injected into the sim at runtime (`--sim-fault-file`), so a test turns a healthy
worker bad mid-run and back: a JSON object (`error_rate`, `error_after_tokens`, `ttft_s`)
re-read when the file changes; a missing or empty file means none."""

from __future__ import annotations

import json
import logging
import os

log = logging.getLogger("sluice.worker")


class Faults:
    """Injected faults, from a JSON file re-read when its mtime changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._mtime = -1
        self.error_rate = 0.0
        self.error_after_tokens = 0
        self.ttft_s = 0.0
        self._due = 0.0  # accumulated share of generations to fail

    def refresh(self) -> None:
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except OSError:
            mtime = 0
        if mtime == self._mtime:
            return
        self._mtime = mtime
        raw: dict[str, float] = {}
        if mtime:
            try:
                with open(self.path) as f:
                    raw = json.loads(f.read() or "{}")
            except (OSError, ValueError) as exc:
                log.warning("sim fault file %s unreadable: %s", self.path, exc)
        self.error_rate = min(1.0, max(0.0, float(raw.get("error_rate", 0.0))))
        self.error_after_tokens = max(0, int(raw.get("error_after_tokens", 0)))
        self.ttft_s = max(0.0, float(raw.get("ttft_s", 0.0)))
        self._due = 0.0
        log.info("sim faults now %s", raw or "none")

    def fails_next(self) -> bool:
        """Whether the generation starting now fails (every 1/error_rate-th does)."""
        self._due += self.error_rate
        if self._due >= 1.0 - 1e-9:
            self._due -= 1.0
            return True
        return False
