"""The sim's prefix cache: vLLM's automatic prefix caching without the memory. Full blocks
of prompt tokens, named by chained hashes (a block's tokens and every block before it),
kept LRU in the KV space running requests leave free; a prompt's hit is its leading cached
blocks, leaving at least one token to compute (as vLLM does). Blocks are named as vLLM
names them (`sluice_common.blocks`), and every block stored or evicted is told to the
engine's `CacheLog` when it has one, as vLLM's KV-cache events are."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from model_service.engines.events import CacheLog
from sluice_common import blocks as block_names


class PrefixCache:
    """Block hashes of cached prompt prefixes, least recently used first."""

    __slots__ = ("_blocks", "block_tokens", "hits", "log", "queried", "root")

    def __init__(
        self, block_tokens: int, log: CacheLog | None = None, seed: str = block_names.DEFAULT_SEED
    ) -> None:
        if block_tokens < 1:
            raise ValueError("block_tokens must be at least 1")
        self.block_tokens = block_tokens
        self.log = log
        self.root = block_names.seed_hash(seed)
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queried = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, h: int) -> bool:
        return h in self._blocks

    def held(self) -> list[int]:
        """The hashes of every block held, least recently used first."""
        return list(self._blocks)

    def hashes(self, token_ids: Sequence[int]) -> list[int]:
        """The chained hash of each full block of `token_ids`, as vLLM names them."""
        return block_names.hashes(token_ids, self.block_tokens, self.root)

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
        new = [h for h in hashes if h not in blocks]
        for h in hashes:
            blocks[h] = None
            blocks.move_to_end(h)
        if new and self.log is not None:
            self.log.stored(new)
        self.evict(room_blocks)
        cached = hit * self.block_tokens
        self.queried += len(token_ids)
        self.hits += cached
        return cached

    def evict(self, room_blocks: int) -> None:
        """Drop the least recently used blocks beyond `room_blocks`."""
        blocks = self._blocks
        gone: list[int] = []
        while len(blocks) > max(0, room_blocks):
            gone.append(blocks.popitem(last=False)[0])
        if gone and self.log is not None:
            self.log.removed(gone)
