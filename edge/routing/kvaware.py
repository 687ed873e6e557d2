"""`kv_aware`: each worker's longest held prefix of a prompt, by its KV-cache events
(`upstream/cachefeed.py`), the prompt's token ids hashed as the engine names blocks. One
walk, hashing only as deep as the decision needs: it stops at the first block nobody
holds, or once one worker alone still holds them all and more cannot change the pick (a
conversation's later turns hash their shared part plus a few blocks, not the history)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from edge.upstream.cachefeed import CacheFeed
from sluice_common import blocks

# Whether the pick is decided whatever worker i, holding its first n blocks (a lower
# bound), holds beyond them, given every worker's hits so far (the others' final).
Decided = Callable[[int, int, list[int]], bool]


def usable(feeds: Sequence[CacheFeed]) -> CacheFeed | None:
    """The first live feed: its layout is the one the walk uses (a pool serves one model
    with one cache configuration; a worker named otherwise counts as holding nothing)."""
    for f in feeds:
        if f.live:
            return f
    return None


def held_prefix(
    ids: Sequence[int], feeds: Sequence[CacheFeed], decided: Decided | None = None
) -> list[int]:
    """For each worker: how many of the prompt's full blocks, from the first, it holds
    (a lower bound for the last holder once `decided` says more cannot change the pick)."""
    hits = [0] * len(feeds)
    first = usable(feeds)
    if first is None or first.naming is None:
        return hits
    naming = first.naming
    alive = [(i, f.held) for i, f in enumerate(feeds) if f.naming == naming]
    depth = 0
    for h in blocks.chain(ids, *naming):
        still = [p for p in alive if h in p[1]]
        if len(still) != len(alive):
            for i, _ in alive:
                hits[i] = depth  # those dropping out now keep this; the rest are raised below
            alive = still
            if not alive:
                return hits
        depth += 1
        if len(alive) == 1 and decided is not None and decided(alive[0][0], depth, hits):
            break
    for i, _ in alive:
        hits[i] = depth
    return hits


def lone_holder(loads: Sequence[float], total: int, load_weight: float) -> Decided:
    """`decided` for `scores.cache_aware`'s score (hit fraction - weight x load / (mean + 1)):
    the last worker holding the prompt, with n blocks, either beats every other worker's
    final score already (more blocks only raise it) or cannot even with all of them."""
    mean = sum(loads) / len(loads) if loads else 0.0
    scale = load_weight / (mean + 1.0)
    best_other: list[float] = []

    def decided(i: int, n: int, hits: list[int]) -> bool:
        if not total:
            return True
        if not best_other:  # the others' hits are final once i is the last holder
            pairs = enumerate(zip(hits, loads, strict=True))
            best_other.append(
                max((h / total - scale * x for j, (h, x) in pairs if j != i), default=-1.0)
            )
        own = scale * loads[i]
        return n / total - own > best_other[0] or 1.0 - own <= best_other[0]

    return decided
