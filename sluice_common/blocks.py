"""Prefix-cache block hashes as vLLM names them (its default `sha256` algorithm): the hash
of a block is SHA-256 over the pickled `(parent hash, token ids, extra keys)`, the first
block's parent being the seed's hash (vLLM's `NONE_HASH`). The sim's cache names blocks
the same way, and an edge recomputes a prompt's hashes with it to look them up in what
the workers' KV-cache events said they hold.

Hashes travel as vLLM's int form of them: the low 64 bits of the digest, big-endian."""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Iterator, Sequence
from itertools import islice

ALGO = "sha256"  # vLLM's default `prefix_caching_hash_algo`, the one algorithm we compute
DEFAULT_SEED = "vllm-none-hash"  # vLLM's seed when PYTHONHASHSEED is not set
_LOW_64 = (1 << 64) - 1
_PROTOCOL = pickle.HIGHEST_PROTOCOL


def seed_hash(seed: str) -> bytes:
    """The parent of a prompt's first block (vLLM's `NONE_HASH` for `seed`)."""
    return hashlib.sha256(pickle.dumps(seed, protocol=_PROTOCOL)).digest()


def as_int(digest: bytes) -> int:
    """A block hash as events carry it: the digest's low 64 bits (vLLM's int form)."""
    return int.from_bytes(digest, "big") & _LOW_64


def digest(parent: bytes, block: tuple[int, ...]) -> bytes:
    """A block's full hash, from its parent's and its token ids (`chain`, one step)."""
    return hashlib.sha256(pickle.dumps((parent, block, None), protocol=_PROTOCOL)).digest()


def chain(token_ids: Sequence[int], block_size: int, root: bytes) -> Iterator[int]:
    """The hash of each full block of `token_ids` in turn (lazily: a caller that stops at
    the first block nobody holds pays for no more)."""
    parent = root
    sha, dumps = hashlib.sha256, pickle.dumps
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = tuple(token_ids[start : start + block_size])
        parent = sha(dumps((parent, block, None), protocol=_PROTOCOL)).digest()
        yield int.from_bytes(parent, "big") & _LOW_64


def hashes(token_ids: Sequence[int], block_size: int, root: bytes) -> list[int]:
    """Every full block's hash (`chain`, all of it)."""
    return list(chain(token_ids, block_size, root))


def trim(held: dict[int, None], cap: int) -> list[int]:
    """Drop the oldest hashes of an insertion-ordered set past `cap` (an eighth more at
    once: a dict's front is slow to find after many deletions there, so rarely and in
    bulk), and return them."""
    if len(held) <= cap:
        return []
    gone = list(islice(held, len(held) - cap + cap // 8))
    for h in gone:
        del held[h]
    return gone
