"""The sim's prefix cache: vLLM's automatic prefix caching without the memory. Full blocks
of prompt tokens, named by chained hashes (a block's tokens and every block before it),
kept LRU in the KV space running requests leave free; a prompt's hit is its leading cached
blocks, leaving at least one token to compute (as vLLM does)."""

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
        usable = max(0, len(token_ids) - 1) // self.block_tokens  # one token is always computed
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
