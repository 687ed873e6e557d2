"""Which worker was sent which prompt prefix: a prompt's chained block hashes (`Prompt`: two
prompts share their first k blocks exactly when their first k pieces are equal) and
`PrefixIndex`, bounded per worker, least recently used out first. Approximate by design
(text, not tokens; workers evict on their own): routing reads it as an expected hit."""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from operator import itemgetter
from typing import Protocol

CHARS_PER_TOKEN = 4  # English text in BPE tokens: for sizing a worker's share of the index
# The index holds up to this many times the estimate: forgetting too late costs a miss on a
# worker that already evicted the prefix; forgetting too early moves a conversation off
# the worker that still holds it (a miss there, and a second copy elsewhere).
INDEX_HEADROOM = 2
# About 256 tokens: fine enough for where a prompt's reuse ends, coarse enough that the
# first 16,000 characters of a conversation (~4,000 tokens) are 16 blocks to hash, look up
# and refresh.
DEFAULT_BLOCK_CHARS = 1024
MAX_BLOCKS = 16  # blocks of a prompt that are hashed and looked up (`Prompt`)
MAX_MESSAGES = 64  # ...of its first messages at most
_SEP_ROLE, _SEP_MSG = "\x1f", "\x1e"


class Prompt:
    """A request's input, with its blocks computed on first use only (then kept).

    Its blocks: the chat messages (roles and contents, with separators) or the raw
    prompt, cut into `block_chars` pieces, each hash chained over every piece before it;
    the last, partial piece counts too. Only the first `MAX_BLOCKS` (of the first
    `MAX_MESSAGES` messages) count: they tell conversations apart and bound a decision's
    cost; behind a shared system prompt longer than that, conversations go by load.
    """

    __slots__ = ("_blocks", "_size", "messages", "prompt", "token_ids")

    def __init__(
        self,
        messages: Sequence[tuple[str, str]] | None = None,
        prompt: str | None = None,
        token_ids: Sequence[int] | None = None,
    ) -> None:
        self.messages = messages
        self.prompt = prompt
        self.token_ids = token_ids  # the engine's tokens, when known (`kv_aware`)
        self._blocks: list[int] | None = None
        self._size = 0

    def text(self, limit: int | None = None) -> str:
        """The input as one string (each message's role and content). With `limit`: only
        what the first `limit` characters of content need, from the first `MAX_MESSAGES`
        messages (found in C: nothing longer is copied)."""
        if self.messages is None:
            return (self.prompt or "")[:limit]
        messages = self.messages
        if limit is not None:
            head = messages[:MAX_MESSAGES]
            ends = list(accumulate(map(len, map(itemgetter(1), head))))
            k = bisect_left(ends, limit)  # the message that reaches `limit`, if one does
            if k < len(head):
                role, content = head[k]
                keep = limit - (ends[k] - len(content))
                messages = [*head[:k], (role, content[:keep])]
            else:
                messages = head
        return _SEP_MSG.join(map(_SEP_ROLE.join, messages))

    def blocks(self, block_chars: int = DEFAULT_BLOCK_CHARS) -> list[int]:
        """The chained hash of each block of the input, at most `MAX_BLOCKS`."""
        if self._blocks is None or self._size != block_chars:
            limit = block_chars * MAX_BLOCKS
            self._blocks = block_hashes(self.text(limit)[:limit], block_chars)
            self._size = block_chars
        return self._blocks


def block_hashes(text: str, block_chars: int) -> list[int]:
    """Chained hashes of `text` in pieces of `block_chars` (the last may be shorter).

    Python's string hash is salted per process: the index is this process's own, so the
    hashes need only agree within it.
    """
    out: list[int] = []
    h = 0
    for start in range(0, len(text), block_chars):
        h = hash((h, text[start : start + block_chars]))
        out.append(h)
    return out


class Holder(Protocol):
    """What the index needs of a worker: its key and the epoch of its cache."""

    @property
    def key(self) -> str: ...

    @property
    def epoch(self) -> int: ...


@dataclass(eq=False, slots=True)
class _Holder:
    """One worker's place in the index."""

    bit: int
    epoch: int
    blocks: OrderedDict[int, None] = field(default_factory=OrderedDict)  # oldest first


class PrefixIndex:
    """Per block hash, the workers sent it (a bit mask: one bit per worker); per worker,
    its blocks in least recently used order, capped at its capacity. `match` walks a
    request's blocks once: O(blocks + workers), whatever the index's size. A worker back
    with a new `epoch` (restarted: its cache is gone) loses what it held; its bit is reused.
    """

    def __init__(self) -> None:
        self._holders: dict[int, int] = {}  # block hash -> bit mask of workers holding it
        self._workers: dict[str, _Holder] = {}  # by worker key
        self._free_bits: list[int] = []
        self._next_bit = 0

    def __len__(self) -> int:
        """Distinct blocks held by any worker."""
        return len(self._holders)

    def held(self, worker: str) -> int:
        """Blocks the index holds for a worker."""
        holder = self._workers.get(worker)
        return len(holder.blocks) if holder is not None else 0

    def _holder(self, worker: str, epoch: int) -> _Holder | None:
        holder = self._workers.get(worker)
        if holder is not None and holder.epoch != epoch:
            self.forget(worker)  # restarted since: its cache is empty
            return None
        return holder

    def match(self, blocks: Sequence[int], workers: Sequence[Holder]) -> list[int]:
        """For each worker: how many of `blocks`, from the first, it holds.

        One walk over the blocks with a mask of everyone who still holds all so far;
        a prompt whose first block nobody holds costs one lookup.
        """
        holders = self._holders
        first = holders.get(blocks[0], 0) if blocks else 0
        if not first:
            return [0] * len(workers)
        found: dict[int, int] = {}  # bit -> leading blocks held, for those who drop out
        live, n = first, 1
        for i in range(1, len(blocks)):
            held = holders.get(blocks[i], 0) & live
            if held != live:
                gone = live & ~held
                while gone:
                    low = gone & -gone
                    found[low] = n
                    gone ^= low
                live = held
                if not live:
                    break
            n += 1
        known = self._workers
        out = []
        for w in workers:
            holder = known.get(w.key)
            if holder is None or not holder.bit & first:
                out.append(0)
            elif holder.epoch != w.epoch:
                self.forget(w.key)  # restarted since: its cache is empty
                out.append(0)
            else:
                out.append(found.get(holder.bit, n))
        return out

    def add(self, blocks: Sequence[int], worker: str, epoch: int, capacity: int) -> None:
        """`worker` was sent these blocks: hold (or refresh) them, oldest evicted past
        `capacity` blocks."""
        holder = self._holder(worker, epoch)
        if holder is None:
            holder = self._workers[worker] = _Holder(self._take_bit(), epoch)
        bit, mine, holders = holder.bit, holder.blocks, self._holders
        for h in blocks:
            if h in mine:
                mine.move_to_end(h)
            else:
                mine[h] = None
                holders[h] = holders.get(h, 0) | bit
        while len(mine) > max(0, capacity):
            h, _ = mine.popitem(last=False)
            self._drop(h, bit)

    def forget(self, worker: str) -> None:
        """Everything `worker` held (it restarted, or left the pool)."""
        holder = self._workers.pop(worker, None)
        if holder is None:
            return
        for h in holder.blocks:
            self._drop(h, holder.bit)
        self._free_bits.append(holder.bit)

    def _drop(self, h: int, bit: int) -> None:
        rest = self._holders.get(h, 0) & ~bit
        if rest:
            self._holders[h] = rest
        else:
            self._holders.pop(h, None)

    def _take_bit(self) -> int:
        if self._free_bits:
            return self._free_bits.pop()
        bit = 1 << self._next_bit
        self._next_bit += 1
        return bit
