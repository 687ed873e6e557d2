"""Token budgets per key: `--key-budget NAME=TOKENS/day|month` (prompt and completion
tokens, UTC days and months; `*` is every key without a budget of its own). A generation
is refused at admission (429 `budget_exceeded`, the reset time in the body and
Retry-After) once the key's usage in the ledger reached a budget; one under way when it
is reached runs to its end (counted then), so a key may go past by its last generations."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from edge.errors import ApiError
from edge.store.base import StoreUnavailable
from edge.store.guarded import RETRY_S
from edge.store.usage import Ledger, day_of

PERIODS = ("day", "month")
EVERY_KEY = "*"


@dataclass(frozen=True, slots=True)
class Budget:
    tokens: int
    period: str  # "day" or "month"


def parse_budget(entry: str) -> tuple[str, Budget]:
    """`NAME=TOKENS/day|month` -> (name, budget); ValueError saying what is wrong."""
    name, _, rest = entry.partition("=")
    amount, _, period = rest.partition("/")
    if not name or period not in PERIODS or not amount.isdigit() or int(amount) < 1:
        raise ValueError(f"--key-budget {entry!r}: expected NAME=TOKENS/day or NAME=TOKENS/month")
    return name, Budget(int(amount), period)


def budgets_of(entries: Iterable[str]) -> dict[str, tuple[Budget, ...]]:
    out: dict[str, list[Budget]] = {}
    for entry in entries:
        name, budget = parse_budget(entry)
        out.setdefault(name, []).append(budget)
    return {name: tuple(b) for name, b in out.items()}


def reset_at(period: str, now: float) -> dt.datetime:
    """When a budget's period ends: the next UTC midnight, or the next month's first."""
    t = dt.datetime.fromtimestamp(now, dt.UTC)
    if period == "day":
        return dt.datetime(t.year, t.month, t.day, tzinfo=dt.UTC) + dt.timedelta(days=1)
    year, month = (t.year + 1, 1) if t.month == 12 else (t.year, t.month + 1)
    return dt.datetime(year, month, 1, tzinfo=dt.UTC)


def budget_exceeded(budget: Budget, used: int, now: float) -> ApiError:
    reset = reset_at(budget.period, now)
    stamp = reset.strftime("%Y-%m-%dT%H:%M:%SZ")
    return ApiError(
        429,
        f"This API key used {used} of its {budget.tokens} tokens per {budget.period}; "
        f"the budget resets at {stamp}.",
        type="insufficient_quota",
        code="budget_exceeded",
        retry_after_s=max(reset.timestamp() - now, 1.0),
        extra={
            "budget_tokens": budget.tokens,
            "budget_period": budget.period,
            "used_tokens": used,
            "resets_at": stamp,
        },
    )


class Budgets:
    """The keys' budgets against the ledger. A failing store is skipped for `RETRY_S`:
    open, the generation is admitted; closed, `StoreUnavailable` (503)."""

    def __init__(
        self,
        budgets: dict[str, tuple[Budget, ...]],
        ledger: Ledger,
        fail_open: bool,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.budgets = budgets
        self.ledger = ledger
        self.fail_open = fail_open
        self.clock = clock
        self._down_until = 0.0

    def __bool__(self) -> bool:
        return bool(self.budgets)

    def of(self, key: str) -> tuple[Budget, ...]:
        return self.budgets.get(key) or self.budgets.get(EVERY_KEY, ())

    async def check(self, key: str) -> ApiError | None:
        """The refusal for a new generation of `key`, or None."""
        budgets = self.of(key)
        if not budgets:
            return None
        now = self.clock()
        if time.monotonic() < self._down_until:
            if self.fail_open:
                return None
            raise StoreUnavailable("the usage ledger is unavailable", RETRY_S)
        try:
            today, month = await self.ledger.spent(key, day_of(now))
        except StoreUnavailable:
            self._down_until = time.monotonic() + RETRY_S
            if self.fail_open:
                return None
            raise
        for b in budgets:
            used = today if b.period == "day" else month
            if used >= b.tokens:
                return budget_exceeded(b, used, now)
        return None
