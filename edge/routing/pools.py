"""Pools as configured: the `--pools` file (JSON or TOML, `edge/pools.example.toml`) and the
`--worker` flags (pool `default`), each pool with its policy and rollback bounds, checked
(`PoolConfigError`)."""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge.config import POLICIES

DEFAULT_POOL = "default"
MAX_NAME = 64


class PoolConfigError(ValueError):
    """A pools file or admin request that does not describe valid pools."""


@dataclass(slots=True)
class RollbackSpec:
    """Bounds on a canary pool: broken over `window_s` with at least `min_requests`
    outcomes, its weight drops to 0.

    `max_error_rate` bounds the errors the pool *adds*: its error rate minus the rest of the
    fleet's over the same window (so clients' own bad requests, which fail everywhere, do
    not roll a canary back). `max_p99_ttft_s` bounds its p99 time to first token.
    """

    max_error_rate: float | None = None
    max_p99_ttft_s: float | None = None
    window_s: float = 60.0
    min_requests: int = 20

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_error_rate": self.max_error_rate,
            "max_p99_ttft_s": self.max_p99_ttft_s,
            "window_s": self.window_s,
            "min_requests": self.min_requests,
        }


@dataclass(slots=True)
class PoolSpec:
    """One pool as configured."""

    name: str
    version: str = ""
    weight: float = 1.0
    workers: list[str] = field(default_factory=list)
    rollback: RollbackSpec | None = None
    policy: str = ""  # "": the edge's --routing-policy


def number(
    raw: dict[str, Any], name: str, default: Any, lo: float = 0.0, hi: float = math.inf
) -> Any:
    """`raw[name]` (or `default`) as a finite number in [lo, hi]; None stays None (a bound
    that is off). PoolConfigError naming it otherwise (pools, rollback, rollout plans)."""
    value = raw.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PoolConfigError(f"{name} must be a number")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an integer past any float
        finite = False
    if not finite:
        raise PoolConfigError(f"{name} must be a finite number")
    if not lo <= value <= hi:
        within = f"at least {lo:g}" if hi == math.inf else f"between {lo:g} and {hi:g}"
        raise PoolConfigError(f"{name} must be {within}")
    return value


def count(raw: dict[str, Any], name: str, default: int, lo: float = 1, hi: float = 1e6) -> int:
    """A whole count that cannot be off (null is refused)."""
    value = number(raw, name, default, lo, hi)
    if value is None:
        raise PoolConfigError(f"{name} must be a number")
    return int(value)


def parse_weight(value: Any) -> float:
    weight = number({"weight": value}, "weight", None)
    if weight is None:
        raise PoolConfigError("weight must be a number")
    return float(weight)


def parse_rollback(raw: Any) -> RollbackSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise PoolConfigError("rollback must be a table/object")
    unknown = set(raw) - set(RollbackSpec.__slots__)  # type: ignore[attr-defined]
    if unknown:
        raise PoolConfigError(f"unknown rollback keys: {sorted(unknown)}")
    spec = RollbackSpec(
        max_error_rate=number(raw, "max_error_rate", None),
        max_p99_ttft_s=number(raw, "max_p99_ttft_s", None),
        window_s=number(raw, "window_s", 60.0, lo=0.1),
        min_requests=count(raw, "min_requests", 20),
    )
    if spec.max_error_rate is None and spec.max_p99_ttft_s is None:
        raise PoolConfigError("rollback needs max_error_rate or max_p99_ttft_s")
    return spec


def parse_pool(raw: Any) -> PoolSpec:
    """One pool from a decoded file entry or an admin request body."""
    if not isinstance(raw, dict):
        raise PoolConfigError("a pool must be a table/object")
    unknown = set(raw) - {"name", "version", "weight", "workers", "rollback", "policy"}
    if unknown:
        raise PoolConfigError(f"unknown pool keys: {sorted(unknown)}")
    name = raw.get("name")
    if not isinstance(name, str) or not name or len(name) > MAX_NAME or "/" in name:
        raise PoolConfigError(f"pool name must be 1-{MAX_NAME} characters without '/'")
    version = raw.get("version", "")
    workers = raw.get("workers", [])
    if not isinstance(version, str):
        raise PoolConfigError(f"pool {name}: version must be a string")
    if not isinstance(workers, list) or not all(isinstance(a, str) and a for a in workers):
        raise PoolConfigError(f"pool {name}: workers must be a list of host:port strings")
    policy = raw.get("policy", "")
    if policy != "" and policy not in POLICIES:
        raise PoolConfigError(f"pool {name}: policy must be one of {', '.join(POLICIES)}")
    try:
        weight = parse_weight(raw.get("weight", 1.0))
        rollback = parse_rollback(raw.get("rollback"))
    except PoolConfigError as exc:
        raise PoolConfigError(f"pool {name}: {exc}") from None
    return PoolSpec(name, version, weight, list(workers), rollback, policy)


def load_pools(path: str) -> list[PoolSpec]:
    """The pools of a file: TOML for `*.toml`, else JSON (`{"pools": [...]}` or a list)."""
    text = Path(path).read_text()
    try:
        raw: Any = tomllib.loads(text) if path.endswith(".toml") else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise PoolConfigError(f"{path}: {exc}") from None
    if isinstance(raw, dict):
        raw = raw.get("pools")
    if not isinstance(raw, list):
        raise PoolConfigError(f"{path}: expected a list of pools under 'pools'")
    return [parse_pool(p) for p in raw]


def build_pools(pools_file: str, addresses: list[str]) -> list[PoolSpec]:
    """The file's pools plus the `default` pool of `--worker` flags; checked for clashes."""
    pools = load_pools(pools_file) if pools_file else []
    if addresses:
        pools.append(PoolSpec(DEFAULT_POOL, "", 1.0, list(addresses)))
    names: set[str] = set()
    seen: set[str] = set()
    for p in pools:
        if p.name in names:
            raise PoolConfigError(f"pool {p.name!r} is defined twice")
        names.add(p.name)
        for a in p.workers:
            if a in seen:
                raise PoolConfigError(f"worker {a} is in more than one pool")
            seen.add(a)
    if not seen:
        raise PoolConfigError("no worker addresses: give --worker or --pools")
    return pools
