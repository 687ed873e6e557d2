"""Routing math: session keys, rendezvous hashing, weighted choices, two random choices."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from edge.routing.scores import (
    hash64,
    hrw,
    hrw_order,
    two_choices,
    weighted_hrw,
    weighted_random,
)

KEYS = [f"session-{i}" for i in range(3000)]
WORKERS = [f"10.0.0.{i}:50051" for i in range(1, 6)]


def ident(x: str) -> str:
    return x


def test_hash_is_stable_across_processes() -> None:
    # A fixed value: edges on other hosts (and after restarts) must agree.
    assert hash64("abc", "10.0.0.1:50051") == hash64("abc", "10.0.0.1:50051")
    assert hash64("abc", "x") != hash64("abd", "x")
    assert hash64("k", "n") == 0xCACF2038045B88B4  # blake2b-64 of "k\0n", pinned


def test_hrw_spreads_keys_evenly() -> None:
    counts = Counter(hrw(k, WORKERS, ident) for k in KEYS)
    assert set(counts) == set(WORKERS)
    expected = len(KEYS) / len(WORKERS)
    assert all(abs(c - expected) < 0.15 * expected for c in counts.values()), counts


def test_removing_a_worker_moves_only_its_keys() -> None:
    before = {k: hrw(k, WORKERS, ident) for k in KEYS}
    gone = WORKERS[2]
    rest = [w for w in WORKERS if w != gone]
    after = {k: hrw(k, rest, ident) for k in KEYS}
    moved = {k for k in KEYS if before[k] != after[k]}
    assert moved == {k for k in KEYS if before[k] == gone}
    # ... and each goes where its rendezvous order says: its second choice.
    assert all(after[k] == hrw_order(k, WORKERS)[1] for k in moved)


def test_adding_a_worker_takes_only_keys_it_wins() -> None:
    before = {k: hrw(k, WORKERS, ident) for k in KEYS}
    more = [*WORKERS, "10.0.0.9:50051"]
    after = {k: hrw(k, more, ident) for k in KEYS}
    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(after[k] == "10.0.0.9:50051" for k in moved)
    assert abs(len(moved) - len(KEYS) / 6) < 0.2 * len(KEYS) / 6


def weights_of(table: dict[str, float]):  # type: ignore[no-untyped-def]
    return lambda name: table[name]


@pytest.mark.parametrize("split", [(1, 1), (3, 1), (9, 1), (1, 0)])
def test_weighted_rendezvous_matches_weights(split: tuple[float, float]) -> None:
    table = {"stable": float(split[0]), "canary": float(split[1])}
    pools = list(table)
    share = sum(weighted_hrw(k, pools, ident, weights_of(table)) == "canary" for k in KEYS)
    expected = split[1] / sum(split)
    assert abs(share / len(KEYS) - expected) < 0.03, share


def test_weight_change_moves_only_the_proportion_it_must() -> None:
    pools = ["stable", "canary", "third"]
    w1 = {"stable": 6.0, "canary": 1.0, "third": 3.0}
    w2 = {**w1, "canary": 3.0}  # canary up: keys only move *to* the canary
    before = {k: weighted_hrw(k, pools, ident, weights_of(w1)) for k in KEYS}
    after = {k: weighted_hrw(k, pools, ident, weights_of(w2)) for k in KEYS}
    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(after[k] == "canary" for k in moved)
    # Share 0.1 -> 0.25: about 15% of keys move, no more.
    assert abs(len(moved) / len(KEYS) - (3 / 12 - 1 / 10)) < 0.03
    # Back down: exactly those keys return.
    back = {k: weighted_hrw(k, pools, ident, weights_of(w1)) for k in KEYS}
    assert back == before


def test_weighted_random_and_zero_weights() -> None:
    rng = random.Random(1)
    table = {"a": 3.0, "b": 1.0}
    picks = Counter(weighted_random(["a", "b"], weights_of(table), rng) for _ in range(8000))
    assert abs(picks["b"] / 8000 - 0.25) < 0.03


def test_two_choices_prefers_the_less_loaded() -> None:
    rng = random.Random(2)
    loads = {"a": 0, "b": 5, "c": 9}
    picks = Counter(two_choices(["a", "b", "c"], loads.__getitem__, rng) for _ in range(3000))
    # "c" can only win against itself, which two distinct choices never draw.
    assert picks["c"] == 0
    assert picks["a"] > picks["b"] > 0
    assert two_choices(["only"], loads.get, rng) == "only"  # type: ignore[arg-type]
