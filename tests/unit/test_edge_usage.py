"""Usage accounting and budgets, in milliseconds: the ledger counts a generation once,
by day, key, tenant and model; the meter keeps a failed batch and counts it once later;
budgets refuse at the limit with the period's reset time, open or closed when the
ledger fails."""

from __future__ import annotations

import datetime as dt

import pytest

from edge.errors import ApiError
from edge.obs.record import RequestRecord
from edge.security.budgets import Budget, Budgets, budgets_of, parse_budget, reset_at
from edge.security.usage import Meter, entry_of
from edge.store.base import StoreUnavailable
from edge.store.usage import Entry, MemoryLedger, days_between, rows, total

NOW = dt.datetime(2026, 12, 31, 23, 0, tzinfo=dt.UTC).timestamp()


def entry(gen: str, key: str = "a", day: str = "2026-12-31", **kw: int) -> Entry:
    p, c, o = kw.get("prompt", 10), kw.get("cached", 4), kw.get("completion", 5)
    return Entry(gen, key, "t-" + key, "m", day, p, c, o)


async def test_the_ledger_counts_each_generation_once_by_day_key_tenant_and_model():
    ledger = MemoryLedger()
    got = await ledger.add(
        [entry("g1"), entry("g2", "b"), entry("g1"), entry("g3", day="2026-12-01")]
    )
    assert got == [True, True, False, True]
    assert await ledger.add([entry("g2", "b")]) == [False]  # a replayed final, later
    cells = await ledger.cells(days_between("2026-12-30", "2026-12-31"))
    assert rows(cells) == [
        {"day": "2026-12-31", "key": "a", "tenant": "t-a", "model": "m", "requests": 1,
         "prompt_tokens": 10, "cached_tokens": 4, "completion_tokens": 5, "total_tokens": 15},
        {"day": "2026-12-31", "key": "b", "tenant": "t-b", "model": "m", "requests": 1,
         "prompt_tokens": 10, "cached_tokens": 4, "completion_tokens": 5, "total_tokens": 15},
    ]  # fmt: skip
    assert [r["key"] for r in rows(cells, tenant="t-b")] == ["b"]
    assert rows(cells, model="other") == []
    assert total(rows(cells))["total_tokens"] == 30
    assert await ledger.spent("a", "2026-12-31") == (15, 30)  # the day, the month


def test_days_between_refuses_reversed_bad_and_too_long_ranges():
    assert days_between("2026-12-30", "2027-01-01") == ["2026-12-30", "2026-12-31", "2027-01-01"]
    for first, last in (("2026-12-02", "2026-12-01"), ("2026-13-01", "2026-12-01")):
        with pytest.raises(ValueError):
            days_between(first, last)
    with pytest.raises(ValueError):
        days_between("2025-01-01", "2026-12-31")


class Flaky(MemoryLedger):
    """Fails its first `fail` adds, after (as Redis may) applying them or not."""

    def __init__(self, fail: int, applied: bool) -> None:
        super().__init__()
        self.fail, self.applied = fail, applied

    async def add(self, entries: list[Entry]) -> list[bool]:
        if self.fail:
            self.fail -= 1
            if self.applied:
                await super().add(entries)  # the answer was lost, the work done
            raise StoreUnavailable("down")
        return await super().add(entries)


@pytest.mark.parametrize("applied", [False, True])
async def test_the_meter_keeps_a_failed_batch_and_counts_it_once(applied):
    ledger = Flaky(1, applied)
    meter = Meter(ledger, clock=lambda: NOW)
    rec = RequestRecord(route="/v1/chat/completions", caller="a", tenant="t-a", model="m")
    meter.record(rec)  # no final seen: nothing
    rec.generation, rec.prompt_tokens, rec.cached_tokens, rec.completion_tokens = "g", 7, 2, 3
    meter.record(rec)
    assert not await meter.flush() and len(meter.pending) == 1 and meter.failures == 1
    assert await meter.flush() and meter.pending == []
    assert await ledger.spent("a", "2026-12-31") == (10, 10)
    # The counters count what the ledger took: none when the lost answer had applied it.
    assert meter.requests[("a", "t-a", "m")] == (0 if applied else 1)
    text = meter.render_metrics()
    assert (
        'sluice_edge_usage_tokens_total{key="a",tenant="t-a",model="m",type="cached"} 2' in text
    ) != applied


def test_a_record_without_a_final_has_no_entry():
    assert entry_of(RequestRecord(route="/v1/models", caller="a"), NOW) is None
    rec = RequestRecord(route="x", caller="a", generation="g", completion_tokens=0)
    assert entry_of(rec, NOW) == Entry("g", "a", "a", "", "2026-12-31", 0, 0, 0)


def test_budgets_parse_and_reset_at_the_end_of_the_utc_day_or_month():
    assert parse_budget("team=1000/day") == ("team", Budget(1000, "day"))
    assert budgets_of(["a=5/day", "a=100/month", "*=9/day"]) == {
        "a": (Budget(5, "day"), Budget(100, "month")),
        "*": (Budget(9, "day"),),
    }
    for bad in ("a=0/day", "a=5/week", "=5/day", "a=x/day", "a"):
        with pytest.raises(ValueError):
            parse_budget(bad)
    assert reset_at("day", NOW) == dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
    assert reset_at("month", NOW) == dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
    mid = dt.datetime(2026, 2, 14, 12, tzinfo=dt.UTC).timestamp()
    assert reset_at("month", mid) == dt.datetime(2026, 3, 1, tzinfo=dt.UTC)


async def test_a_budget_refuses_once_reached_with_the_reset_time():
    ledger = MemoryLedger()
    budgets = Budgets(budgets_of(["a=30/day", "*=1000/month"]), ledger, True, clock=lambda: NOW)
    await ledger.add([entry("g1")])  # 15 tokens
    assert await budgets.check("a") is None
    await ledger.add([entry("g2")])  # 30: reached
    err = await budgets.check("a")
    assert isinstance(err, ApiError) and err.status == 429 and err.code == "budget_exceeded"
    assert err.body()["error"] == {
        "message": "This API key used 30 of its 30 tokens per day; the budget resets at "
        "2027-01-01T00:00:00Z.",
        "type": "insufficient_quota",
        "param": None,
        "code": "budget_exceeded",
        "budget_tokens": 30,
        "budget_period": "day",
        "used_tokens": 30,
        "resets_at": "2027-01-01T00:00:00Z",
    }
    assert err.headers()["retry-after"] == "3600"
    assert await budgets.check("b") is None  # '*': 1000 a month, none used


class Down(MemoryLedger):
    async def spent(self, key: str, day: str) -> tuple[int, int]:
        raise StoreUnavailable("down")


async def test_a_failing_ledger_admits_when_open_and_refuses_when_closed():
    assert await Budgets({"a": (Budget(1, "day"),)}, Down(), True).check("a") is None
    closed = Budgets({"a": (Budget(1, "day"),)}, Down(), False)
    for _ in range(2):  # the second one skips the ledger (down for a while)
        with pytest.raises(StoreUnavailable):
            await closed.check("a")


@pytest.mark.parametrize(
    "args",
    [
        ["--key-budget", "a=100/week"],
        ["--key-budget", "a=-5/day"],
        ["--key-tenant", "a=team a"],
        ["--key-tenant", "a"],
        ["--audit-redact", "(unclosed"],
        ["--audit-max-bytes", "10"],
    ],
)
def test_bad_budget_tenant_and_audit_flags_are_refused_at_the_command_line(args):
    from edge.config import build_parser, config_from_args

    with pytest.raises(SystemExit):
        config_from_args(build_parser().parse_args(args))


def test_good_flags_parse_into_their_sections():
    from edge.config import build_parser, config_from_args

    argv = ["--key-budget", "*=9/month", "--key-tenant", "a=t", "--audit-log", "-"]
    cfg = config_from_args(build_parser().parse_args([*argv, "--audit-redact", "/request/x"]))
    assert (cfg.security.key_budgets, cfg.security.key_tenants) == (["*=9/month"], ["a=t"])
    assert (cfg.audit.path, cfg.audit.redact, cfg.audit.bodies) == ("-", ["/request/x"], False)
