"""`kv_aware`: each worker's longest held prefix of a prompt, by its KV-cache events
(`upstream/cachefeed.py`: one `Owners` probe a block), the prompt's token ids hashed as
the engine names blocks (`HashMemo`: earlier turns' hashes kept). One walk, only as deep
as the pick (`scores.holder_first`) needs: to the first block nobody holds, or one past
where one worker alone is left holding (a later turn hashes the shared part, not the
history)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from edge.upstream.cachefeed import CacheFeed
from sluice_common import blocks

# Blocks `HashMemo` keeps (~0.9 KB each: the key's 16 token ids as Python ints, the
# digests): 500 conversations' first 32 blocks, 15 MB at most.
MEMO_BLOCKS = 16_384


class HashMemo:
    """Block hashes computed before, by (parent digest, token ids): exact, as the chain is
    (a block's hash names its whole prefix). A hit costs a tuple and a probe (~0.3 µs)
    where hashing costs a pickle and a SHA-256 (~1.5 µs). Emptied when full: a
    conversation's next turn then hashes again once."""

    def __init__(self, size: int = MEMO_BLOCKS) -> None:
        self.size = size
        self._known: dict[tuple[bytes, tuple[int, ...]], tuple[bytes, int]] = {}

    def __len__(self) -> int:
        return len(self._known)

    def chain(self, ids: Sequence[int], block_size: int, root: bytes) -> Iterator[int]:
        """`blocks.chain`, through the memo."""
        known, parent = self._known, root
        for start in range(0, len(ids) - block_size + 1, block_size):
            key = (parent, tuple(ids[start : start + block_size]))
            got = known.get(key)
            if got is None:
                full = blocks.digest(*key)
                got = (full, blocks.as_int(full))
                if len(known) >= self.size:
                    known.clear()
                known[key] = got
            parent = got[0]
            yield got[1]


def usable(feeds: Sequence[CacheFeed]) -> CacheFeed | None:
    """The first live feed: its layout is the one the walk uses (a pool serves one model
    with one cache configuration; a worker named otherwise counts as holding nothing)."""
    for f in feeds:
        if f.live:
            return f
    return None


def held_prefix(
    ids: Sequence[int],
    feeds: Sequence[CacheFeed],
    memo: HashMemo | None = None,
    longest: bool = False,
) -> list[int]:
    """For each worker: how many of the prompt's full blocks, from the first, it holds.
    `longest`: only who holds the longest prefix matters, so the walk stops one block
    after the last other holder dropped out (the lone holder's count a lower bound)."""
    hits = [0] * len(feeds)
    first = usable(feeds)
    if first is None or first.naming is None:
        return hits
    naming, owners = first.naming, first.owners
    index: dict[int, int] = {}  # a live feed's bit -> its place in `feeds`
    for i, f in enumerate(feeds):
        if f.bit and f.naming == naming and f.owners is owners:
            index[f.bit] = i
    alive = sum(index)  # the bits of those holding every block so far
    masks = owners.masks
    depth = 0
    hashes = memo.chain(ids, *naming) if memo is not None else blocks.chain(ids, *naming)
    for h in hashes:
        still = masks.get(h, 0) & alive
        if still != alive:
            gone = alive ^ still
            while gone:  # those dropping out now keep this depth
                low = gone & -gone
                hits[index[low]] = depth
                gone ^= low
            alive = still
            if not alive:
                return hits
        depth += 1
        if longest and not alive & (alive - 1):
            break
    while alive:
        low = alive & -alive
        hits[index[low]] = depth
        alive ^= low
    return hits
