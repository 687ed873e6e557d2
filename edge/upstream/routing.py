"""Routing math, pure: session keys, rendezvous hashing, weighted choices, two random choices.

Every function here is deterministic given its inputs (and the `random.Random` passed in),
so edges in different processes or on different hosts agree on where a session goes: the
hashes use the pool name and the worker address, never anything local to one process.

- A request's *session key* comes from, in order: the `X-Session-ID` header, the
  `sluice_session` cookie, the OpenAI `user` field. None of them: no key, route by load.
- Pool for a key: weighted rendezvous hashing (score `-w / ln(u)`, `u` the key's hash on
  the pool mapped into (0, 1)): a pool wins a key with probability weight / total, and a
  weight change moves only the keys that must move (to or from the changed pool).
- Worker in a pool for a key: rendezvous (HRW) hashing: removing a worker moves only its
  own keys, adding one takes only the keys it now wins.
- Without a key: a pool at random by weight, then the less loaded of two random workers.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

SESSION_HEADER = "x-session-id"
SESSION_COOKIE = "sluice_session"
MAX_KEY_CHARS = 256  # longer values are cut (they still hash consistently)
_TWO_64 = float(2**64)

T = TypeVar("T")


def session_key(headers: Mapping[str, str], cookies: Mapping[str, str], user: str | None) -> str:
    """The conversation key of a request ("" for none): header, then cookie, then `user`."""
    for value in (headers.get(SESSION_HEADER), cookies.get(SESSION_COOKIE), user):
        if value is not None and (value := value.strip()):
            return value[:MAX_KEY_CHARS]
    return ""


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
