"""The usage ledger: tokens and requests per (UTC day, key, tenant, model), in this process
(`MemoryLedger`) or Redis (`RedisLedger`: the fleet's one figure, kept across restarts).
An entry carries its generation's original id and counts only if that id was not seen
within `SEEN_TTL_S` (a resume replaying a final, a retried batch: nothing added). Redis:
`<prefix>:usage:day:<day>` hashes of `<figure>|<key>|<tenant>|<model>`, `spent:<day or
month>` hashes of key -> tokens (budgets), `seen:<id>`."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import cachetools

from edge.store.connection import RedisConnection

FIGURES = ("requests", "prompt", "cached", "completion")
SEEN_TTL_S = 3600.0  # longer than any resume of a generation can come after its end
MAX_DAYS = 366  # the longest range one query reads


@dataclass(frozen=True, slots=True)
class Entry:
    """One finished generation's usage."""

    generation: str  # the original request id: continuations and resumes share it
    key: str
    tenant: str
    model: str
    day: str  # YYYY-MM-DD (UTC) when it ended
    prompt: int
    cached: int
    completion: int

    @property
    def tokens(self) -> int:
        return self.prompt + self.completion  # cached tokens are part of the prompt's


Cell = tuple[str, str, str, str]  # (day, key, tenant, model)


def day_of(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d")


def days_between(first: str, last: str) -> list[str]:
    """The days from `first` to `last` inclusive (ValueError: bad dates, reversed, or more
    than MAX_DAYS)."""
    a, b = dt.date.fromisoformat(first), dt.date.fromisoformat(last)
    n = (b - a).days + 1
    if n < 1 or n > MAX_DAYS:
        raise ValueError(f"a range of 1 to {MAX_DAYS} days, from <= to")
    return [(a + dt.timedelta(days=i)).isoformat() for i in range(n)]


class Ledger(Protocol):
    async def add(self, entries: list[Entry]) -> list[bool]:
        """Count each entry unless its generation was counted already; which were."""
        ...

    async def spent(self, key: str, day: str) -> tuple[int, int]:
        """Tokens `key` used on `day` and in its month."""
        ...

    async def cells(self, days: list[str]) -> dict[Cell, dict[str, int]]:
        """Every (day, key, tenant, model) of `days` with its figures."""
        ...

    async def close(self) -> None: ...


class MemoryLedger:
    """`Ledger` in this process (the default: each edge process counts its own)."""

    def __init__(self, timer: Callable[[], float] | None = None) -> None:
        self.counts: dict[Cell, dict[str, int]] = defaultdict(lambda: dict.fromkeys(FIGURES, 0))
        self.totals: dict[tuple[str, str], int] = defaultdict(int)  # (day or month, key)
        kwargs: dict[str, Any] = {} if timer is None else {"timer": timer}
        self.seen: cachetools.TTLCache[str, bool] = cachetools.TTLCache(
            1 << 20, SEEN_TTL_S, **kwargs
        )

    async def add(self, entries: list[Entry]) -> list[bool]:
        out = []
        for e in entries:
            fresh = e.generation not in self.seen
            if fresh:
                self.seen[e.generation] = True
                cell = self.counts[(e.day, e.key, e.tenant, e.model)]
                for name, value in zip(FIGURES, (1, e.prompt, e.cached, e.completion), strict=True):
                    cell[name] += value
                self.totals[(e.day, e.key)] += e.tokens
                self.totals[(e.day[:7], e.key)] += e.tokens
            out.append(fresh)
        return out

    async def spent(self, key: str, day: str) -> tuple[int, int]:
        return self.totals.get((day, key), 0), self.totals.get((day[:7], key), 0)

    async def cells(self, days: list[str]) -> dict[Cell, dict[str, int]]:
        wanted = set(days)
        return {c: dict(v) for c, v in self.counts.items() if c[0] in wanted}

    async def close(self) -> None:
        return None


# ARGV: the key prefix, seen ttl (ms), then 8 per entry: generation, day, key, tenant,
# model, prompt, cached, completion. KEYS: none (the names are built from the prefix:
# every key lives on the one server, as the other scripts' do). The counters have no ttl
# (a volatile-* maxmemory policy never evicts them; a day's hash is small); the seen
# markers do. Returns one 1/0 per entry: counted, or seen before.
ADD = """
local prefix, ttl = ARGV[1], tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV, 8 do
  local gen, day, key, tenant, model = ARGV[i], ARGV[i+1], ARGV[i+2], ARGV[i+3], ARGV[i+4]
  local p, c, o = tonumber(ARGV[i+5]), tonumber(ARGV[i+6]), tonumber(ARGV[i+7])
  if redis.call('SET', prefix .. 'seen:' .. gen, 1, 'NX', 'PX', ttl) then
    local h = prefix .. 'day:' .. day
    local tail = '|' .. key .. '|' .. tenant .. '|' .. model
    redis.call('HINCRBY', h, 'requests' .. tail, 1)
    redis.call('HINCRBY', h, 'prompt' .. tail, p)
    redis.call('HINCRBY', h, 'cached' .. tail, c)
    redis.call('HINCRBY', h, 'completion' .. tail, o)
    for _, period in ipairs({day, string.sub(day, 1, 7)}) do
      redis.call('HINCRBY', prefix .. 'spent:' .. period, key, p + o)
    end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
"""


class RedisLedger(RedisConnection):
    """`Ledger` in Redis (`--store-url`): the fleet's one figure (module docstring)."""

    def __init__(self, url: str, timeout_s: float, prefix: str = "sluice") -> None:
        super().__init__(url, timeout_s, decode_responses=True)
        self.prefix = f"{prefix}:usage:"
        self._add = self.client.register_script(ADD)

    async def add(self, entries: list[Entry]) -> list[bool]:
        if not entries:
            return []
        args: list[Any] = [self.prefix, int(SEEN_TTL_S * 1000)]
        for e in entries:
            args += [e.generation, e.day, e.key, e.tenant, e.model]
            args += [e.prompt, e.cached, e.completion]
        got = await self.call(self._add(keys=[], args=args))
        return [bool(x) for x in got]

    async def spent(self, key: str, day: str) -> tuple[int, int]:
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(self.prefix + "spent:" + day, key)
        pipe.hget(self.prefix + "spent:" + day[:7], key)
        today, month = await self.call(pipe.execute())
        return int(today or 0), int(month or 0)

    async def cells(self, days: list[str]) -> dict[Cell, dict[str, int]]:
        pipe = self.client.pipeline(transaction=False)
        for day in days:
            pipe.hgetall(self.prefix + "day:" + day)
        hashes: list[dict[str, str]] = await self.call(pipe.execute())
        out: dict[Cell, dict[str, int]] = {}
        for day, fields in zip(days, hashes, strict=True):
            for name, value in fields.items():
                figure, key, tenant, model = name.split("|", 3)
                cell = out.setdefault((day, key, tenant, model), dict.fromkeys(FIGURES, 0))
                if figure in cell:
                    cell[figure] = int(value)
        return out


def rows(
    cells: dict[Cell, dict[str, int]],
    key: str | None = None,
    tenant: str | None = None,
    model: str | None = None,
) -> list[dict[str, Any]]:
    """The cells a filter keeps, as the admin API shows them (by day, key, tenant, model)."""
    out = []
    for (day, k, t, m), f in sorted(cells.items()):
        if (key is None or k == key) and (tenant is None or t == tenant):
            if model is None or m == model:
                out.append({"day": day, "key": k, "tenant": t, "model": m, **figures(f)})
    return out


def figures(f: dict[str, int]) -> dict[str, int]:
    return {
        "requests": f["requests"],
        "prompt_tokens": f["prompt"],
        "cached_tokens": f["cached"],
        "completion_tokens": f["completion"],
        "total_tokens": f["prompt"] + f["completion"],
    }


def total(found: Iterable[dict[str, Any]]) -> dict[str, int]:
    names = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens", "total_tokens")
    out = dict.fromkeys(names, 0)
    for r in found:
        for n in names:
            out[n] += r[n]
    return out
