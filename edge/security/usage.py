"""Usage accounting: a finished generation's request record (its final's usage noted, its
generation id set) becomes a ledger entry, queued in this process; one task adds what is
queued in batches (one store round trip a batch, off the response path). A failed batch
is kept and tried again after `RETRY_S`: an answer lost on the way is harmless, the
ledger counts each generation id once. Prometheus counters count what the ledger took."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

from edge.obs.prom import Exposition, labels
from edge.obs.record import RequestRecord
from edge.store.base import StoreUnavailable
from edge.store.guarded import RETRY_S
from edge.store.usage import Entry, Ledger, day_of

log = logging.getLogger("sluice.edge")
MAX_PENDING = 100_000  # entries kept while the store fails; past it the newest are dropped
Labels = tuple[str, str, str]  # (key, tenant, model)


def entry_of(rec: RequestRecord, now: float) -> Entry | None:
    """The record's usage entry, None unless it saw a generation's final usage."""
    if not rec.generation or rec.completion_tokens is None:
        return None
    key = rec.caller or ""
    return Entry(
        rec.generation,
        key,
        rec.tenant or key,
        rec.model,
        day_of(now),
        rec.prompt_tokens or 0,
        rec.cached_tokens or 0,
        rec.completion_tokens,
    )


class Meter:
    """This process's side of usage accounting (see the module docstring)."""

    def __init__(self, ledger: Ledger, clock: Callable[[], float] = time.time) -> None:
        self.ledger = ledger
        self.clock = clock
        self.pending: list[Entry] = []
        self._wake = asyncio.Event()
        self.requests: Counter[Labels] = Counter()
        self.tokens: Counter[tuple[str, str, str, str]] = Counter()  # + the token type
        self.failures = 0  # batches the store failed
        self.dropped = 0  # entries lost: more than MAX_PENDING waited

    def record(self, rec: RequestRecord) -> None:
        """Queue the record's usage, if it has any (an `ObsMiddleware` sink)."""
        entry = entry_of(rec, self.clock())
        if entry is None:
            return
        if len(self.pending) >= MAX_PENDING:
            self.dropped += 1
            return
        self.pending.append(entry)
        self._wake.set()

    async def run(self) -> None:
        """Add what is queued, batch after batch, for as long as the edge runs."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not await self.flush():
                await asyncio.sleep(RETRY_S)
                self._wake.set()

    async def flush(self) -> bool:
        """Add the queued entries now; False (they stay queued) when the store failed."""
        batch, self.pending = self.pending, []
        if not batch:
            return True
        try:
            counted = await self.ledger.add(batch)
        except StoreUnavailable as exc:
            self.failures += 1
            log.warning("usage of %d generations not counted yet: %s", len(batch), exc)
            self.pending = (batch + self.pending)[:MAX_PENDING]
            return False
        for e, ok in zip(batch, counted, strict=True):
            if ok:
                cell = (e.key, e.tenant, e.model)
                self.requests[cell] += 1
                self.tokens[(*cell, "prompt")] += e.prompt
                self.tokens[(*cell, "cached")] += e.cached
                self.tokens[(*cell, "completion")] += e.completion
        return True

    def render_metrics(self) -> str:
        out = Exposition()
        out.family(
            "sluice_edge_usage_requests_total",
            "counter",
            "Generations counted in the usage ledger (each once), by key, tenant and model.",
            [(labels(key=k, tenant=t, model=m), n) for (k, t, m), n in self.requests.items()],
        )
        out.family(
            "sluice_edge_usage_tokens_total",
            "counter",
            "Tokens counted in the usage ledger, by key, tenant, model and type "
            "(prompt, cached: the prompt's tokens found in the cache, completion).",
            [
                (labels(key=k, tenant=t, model=m, type=kind), n)
                for (k, t, m, kind), n in self.tokens.items()
            ],
        )
        out.family(
            "sluice_edge_usage_pending",
            "gauge",
            "Usage entries waiting to be added to the ledger (the store failing).",
            [("", len(self.pending))],
        )
        out.family(
            "sluice_edge_usage_dropped_total",
            "counter",
            f"Usage entries lost: more than {MAX_PENDING} waited for a failing store.",
            [("", self.dropped)],
        )
        return out.text()
