"""The sim's embeddings (`--runner pooling`): a vector per input, the mean of its tokens'
fixed pseudo-random vectors (inputs sharing tokens lie near each other), cut to the
dimensions asked (Matryoshka: any length up to the full one), then normalized."""

from __future__ import annotations

import functools
import math
import random


@functools.lru_cache(maxsize=65_536)
def token_vector(token_id: int, size: int) -> tuple[float, ...]:
    """A token's vector: the same on every run and every machine."""
    rng = random.Random(token_id * 7919 + size)
    return tuple(rng.uniform(-1.0, 1.0) for _ in range(size))


def embed(ids: list[int], size: int, dimensions: int | None, normalize: bool) -> list[float]:
    """One input's vector (see the module docstring)."""
    total = [0.0] * size
    for tid in ids:
        for j, v in enumerate(token_vector(tid, size)):
            total[j] += v
    vec = [v / len(ids) for v in total[: dimensions or size]]
    if normalize:
        norm = math.sqrt(sum(v * v for v in vec)) or 1.0
        vec = [v / norm for v in vec]
    return vec
