"""The simulated engine's prefix cache: KV blocks of prompts, found by chained hashes, LRU.

A real engine (vLLM's automatic prefix caching) keeps the KV of full token blocks after a
request ends, names each block by a hash of its tokens *and* of every block before it,
and lets a later prompt skip the prefill of its leading blocks that are still held. It
evicts the least recently used blocks when running requests need the memory. This is
that bookkeeping without the memory: block hashes in an LRU.

- Only full blocks are cached; a prompt's hit is its longest run of leading cached
  blocks, capped so that at least one prompt token is computed (as vLLM does).
- `admit()` looks a prompt up, marks its hit blocks as just used, adds its other full
  blocks, then evicts the least recently used blocks beyond the room it is given (the KV
  space running requests leave free). Blocks of running requests are not pinned: the
  sim reserves their KV separately, so the cache can only be smaller than a real one.
- Counters in tokens: `queried` (prompt tokens looked up) and `hits` (tokens found), the
  figures vLLM's `PrefixCacheStats` reports.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    """Block hashes of cached prompt prefixes, least recently used first."""

    __slots__ = ("_blocks", "block_tokens", "hits", "queried")

    def __init__(self, block_tokens: int) -> None:
        if block_tokens < 1:
            raise ValueError("block_tokens must be at least 1")
        self.block_tokens = block_tokens
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queried = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def hashes(self, token_ids: Sequence[int]) -> list[int]:
        """The chained hash of each full block of `token_ids` (deterministic: ints only)."""
        b = self.block_tokens
        out: list[int] = []
        h = 0
        for start in range(0, len(token_ids) - b + 1, b):
            h = hash((h, tuple(token_ids[start : start + b])))
            out.append(h)
        return out

    def admit(self, token_ids: Sequence[int], room_blocks: int) -> int:
        """A prompt starts its prefill: the number of its tokens served from the cache.

        Its full blocks are cached from now on; the cache is then cut to `room_blocks`.
        """
        hashes = self.hashes(token_ids)
        blocks = self._blocks
        usable = (len(token_ids) - 1) // self.block_tokens  # one token is always computed
        hit = 0
        for h in hashes:
            if h not in blocks:
                break
            hit += 1
        hit = min(hit, usable)
        for h in hashes:
            blocks[h] = None
            blocks.move_to_end(h)
        self.evict(room_blocks)
        cached = hit * self.block_tokens
        self.queried += len(token_ids)
        self.hits += cached
        return cached

    def evict(self, room_blocks: int) -> None:
        """Drop the least recently used blocks beyond `room_blocks`."""
        blocks = self._blocks
        while len(blocks) > max(0, room_blocks):
            blocks.popitem(last=False)
