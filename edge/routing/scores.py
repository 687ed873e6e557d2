"""Routing math, pure and deterministic given its inputs (and the `random.Random` passed):
hashes use pool names and worker addresses only, so every edge process and host agrees on
where a session goes. Rendezvous hashing moves only the keys that must move when a node
or a weight changes."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

SESSION_HEADER = "x-session-id"
SESSION_COOKIE = "sluice_session"
MAX_KEY_CHARS = 256  # longer values are cut (they still hash consistently)
_TWO_64 = float(2**64)

T = TypeVar("T")


def hash64(key: str, node: str) -> int:
    """A stable 64-bit hash of (key, node); the same on every host and Python version."""
    digest = hashlib.blake2b(f"{key}\x00{node}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def hrw(key: str, nodes: Sequence[T], name: Callable[[T], str]) -> T:
    """The node with the highest rendezvous score for `key` (nodes must not be empty)."""
    return max(nodes, key=lambda n: (hash64(key, name(n)), name(n)))


def hrw_order(key: str, names: Sequence[str]) -> list[str]:
    """All names, best rendezvous score first (where the key goes as nodes leave)."""
    return sorted(names, key=lambda n: (hash64(key, n), n), reverse=True)


def weighted_score(key: str, node: str, weight: float) -> float:
    """Weighted rendezvous score: the highest one wins with probability weight / total."""
    if weight <= 0:
        return -math.inf
    u = (hash64(key, node) + 0.5) / _TWO_64  # in (0, 1), never 0 or 1
    return -weight / math.log(u)


def weighted_hrw(
    key: str, nodes: Sequence[T], name: Callable[[T], str], weight: Callable[[T], float]
) -> T:
    """The node a key sticks to when nodes carry weights (nodes must not be empty)."""
    return max(nodes, key=lambda n: (weighted_score(key, name(n), weight(n)), name(n)))


def weighted_random(nodes: Sequence[T], weight: Callable[[T], float], rng: random.Random) -> T:
    """A node at random with probability weight / total (all weights > 0, nodes not empty)."""
    total = sum(weight(n) for n in nodes)
    x = rng.random() * total
    for n in nodes:
        x -= weight(n)
        if x < 0:
            return n
    return nodes[-1]  # rounding


def two_choices(nodes: Sequence[T], load: Callable[[T], float], rng: random.Random) -> T:
    """Power of two choices: the less loaded of two distinct random nodes (ties: the first
    drawn, itself random)."""
    if len(nodes) == 1:
        return nodes[0]
    a, b = rng.sample(range(len(nodes)), 2)
    return nodes[b] if load(nodes[b]) < load(nodes[a]) else nodes[a]


def least_loaded(loads: Sequence[float], rng: random.Random) -> int:
    """The index of the least loaded node (ties: one of them at random)."""
    low = min(loads)
    ties = [i for i, x in enumerate(loads) if x == low]
    return ties[0] if len(ties) == 1 else rng.choice(ties)


@dataclass(frozen=True, slots=True)
class CacheAware:
    """The `cache_aware` trade-off between an expected prefix-cache hit and load.

    score = hit fraction - load_weight * load / (mean load + 1): a worker holding the
    whole prompt beats an idle one unless it carries about `1 / load_weight` times the
    mean load more. The balance threshold, as SGLang's `cache_aware`: when the winner's
    load exceeds the least loaded worker's by more than `balance_abs` *and* by a factor
    `balance_rel`, the least loaded takes the request instead (a hot prefix spreads to
    another worker, which then holds it too).
    """

    load_weight: float = 0.5
    balance_abs: float = 8.0
    balance_rel: float = 1.5


def cache_aware(
    hits: Sequence[int], total: int, loads: Sequence[float], params: CacheAware, rng: random.Random
) -> tuple[int, str]:
    """The index of the node for a request of `total` blocks, of which node i holds the
    first `hits[i]`, and why: "cache" (a hit decided), "load" (no hit anywhere, or the
    load outweighed it) or "balance" (the threshold overruled the score)."""
    mean = sum(loads) / len(loads)
    scale = params.load_weight / (mean + 1.0)
    best: list[int] = []
    best_score = -math.inf
    for i, (hit, load) in enumerate(zip(hits, loads, strict=True)):
        score = (hit / total if total else 0.0) - scale * load
        if score > best_score:
            best, best_score = [i], score
        elif score == best_score:
            best.append(i)
    pick = best[0] if len(best) == 1 else rng.choice(best)
    low = min(loads)
    if loads[pick] - low > params.balance_abs and loads[pick] > params.balance_rel * low:
        return _least_loaded_best_hit(hits, loads, rng), "balance"
    top_hit = max(hits)
    return pick, "cache" if top_hit and hits[pick] == top_hit else "load"


def _least_loaded_best_hit(
    hits: Sequence[int],
    loads: Sequence[float],
    rng: random.Random,
    among: Sequence[int] | None = None,
) -> int:
    cands = range(len(loads)) if among is None else among
    low = min(loads[i] for i in cands)
    ties = [i for i in cands if loads[i] == low]
    most = max(hits[i] for i in ties)
    ties = [i for i in ties if hits[i] == most]
    return ties[0] if len(ties) == 1 else rng.choice(ties)


def holder_first(
    hits: Sequence[int],
    loads: Sequence[float],
    free: Sequence[bool],
    slack: float,
    rng: random.Random,
) -> tuple[int, str]:
    """`kv_aware`'s pick: the index of the node for a request of which node i holds the
    first `hits[i]` blocks, and why. The node holding the longest prefix (the least
    loaded of those tied) takes it ("cache"; "load" when nobody holds a block) unless its
    load exceeds the least loaded node's by more than `slack` generations: then the least
    loaded does ("balance"). Nodes without a free batch slot (`free[i]` false) are left
    out while any has one, so a hot conversation never queues on a saturated worker.

    Absolute, not relative: a factor over the least loaded says nothing at low loads
    (1 vs 0 is infinitely more), and it is the extra generations that add queueing."""
    cands = [i for i, f in enumerate(free) if f] or list(range(len(loads)))
    top = max(hits[i] for i in cands)
    holders = [i for i in cands if hits[i] == top]
    light = min(loads[i] for i in holders)
    holders = [i for i in holders if loads[i] == light]
    pick = holders[0] if len(holders) == 1 else rng.choice(holders)
    low = min(loads[i] for i in cands)
    if loads[pick] - low > slack:
        return _least_loaded_best_hit(hits, loads, rng, cands), "balance"
    return pick, "cache" if top else "load"
