"""`kv_aware`: each worker's longest held prefix of a prompt, by its KV-cache events
(`upstream/cachefeed.py`), the prompt's token ids hashed as the engine names blocks. One
walk, hashing only as deep as the decision needs: it stops at the first block nobody
holds, or once one worker alone still holds them all and already wins with that many (a
conversation's later turns hash their shared part plus a few blocks, not the history)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from edge.upstream.cachefeed import CacheFeed
from sluice_common import blocks

# Whether worker i, holding its first n blocks (a lower bound), wins already, given
# every worker's hits so far (the others' are final by then).
Enough = Callable[[int, int, list[int]], bool]


def usable(feeds: Sequence[CacheFeed]) -> CacheFeed | None:
    """The first live feed: its layout is the one the walk uses (a pool serves one model
    with one cache configuration; a worker named otherwise counts as holding nothing)."""
    for f in feeds:
        if f.live:
            return f
    return None


def held_prefix(
    ids: Sequence[int], feeds: Sequence[CacheFeed], enough: Enough | None = None
) -> list[int]:
    """For each worker: how many of the prompt's full blocks, from the first, it holds
    (a lower bound for a lone winner when `enough` says so: module docstring)."""
    hits = [0] * len(feeds)
    first = usable(feeds)
    if first is None or first.layout is None:
        return hits
    lay = first.layout
    alive = [
        i
        for i, f in enumerate(feeds)
        if f.live
        and f.layout is not None
        and f.layout.block_size == lay.block_size
        and f.layout.hash_seed == lay.hash_seed
    ]
    for depth, h in enumerate(blocks.chain(ids, lay.block_size, lay.hash_seed), 1):
        alive = [i for i in alive if h in feeds[i].held]
        if not alive:
            break
        for i in alive:
            hits[i] = depth
        if len(alive) == 1 and enough is not None and enough(alive[0], depth, hits):
            break
    return hits


def lone_winner(loads: Sequence[float], total: int, load_weight: float) -> Enough:
    """`enough` for `scores.cache_aware`'s score (hit fraction - weight x load / (mean + 1)):
    worker i with n blocks beats every other worker's final score. Others' hits are
    final once i is the only one left, so their best score is computed once."""
    mean = sum(loads) / len(loads) if loads else 0.0
    scale = load_weight / (mean + 1.0)
    best_other: list[float] = []

    def enough(i: int, n: int, hits: list[int]) -> bool:
        if not total:
            return True
        if not best_other:
            pairs = enumerate(zip(hits, loads, strict=True))
            best_other.append(
                max((h / total - scale * x for j, (h, x) in pairs if j != i), default=-1.0)
            )
        return n / total - scale * loads[i] > best_other[0]

    return enough
