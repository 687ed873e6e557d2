"""The fail-open stream rule (`edge.store.presence`): a process's part of a key's limit
from its last look, and the looks kept newest first."""

from __future__ import annotations

import zlib

import pytest

from edge.store.presence import Sightings, outage_limit


def parts(key: str, limit: int, total: int, owns: list[int]) -> list[int]:
    """Each process's part when all looked at once (ranks 0..n-1)."""
    return [outage_limit(key, limit, total, own, len(owns), r) for r, own in enumerate(owns)]


@pytest.mark.parametrize(
    "limit, total, owns, want",
    [
        (4, 0, [0, 0], [2, 2]),  # an idle key: half each
        (4, 4, [3, 1], [3, 1]),  # full: each its own, nothing more
        (4, 2, [1, 0], [2, 1]),  # two free: one each
        (2, 0, [0, 0, 0, 0], [1, 1, 0, 0]),  # fewer slots than processes: two of them
        (1, 1, [1, 0], [1, 0]),  # full: none for the other
        (4, 6, [2, 4], [2, 4]),  # more held than the limit (a lowered limit): no free part
    ],
)
def test_a_process_holds_its_own_and_its_part_of_the_free_slots(limit, total, owns, want):
    key = "k5"  # turned by crc32: rank 0 first for this key
    assert zlib.crc32(key.encode()) % len(owns) == 0
    assert parts(key, limit, total, owns) == want


def test_no_process_counted_yet_is_this_one_alone() -> None:
    assert outage_limit("k", 4, 1, 0, replicas=0, rank=0) == 3


def test_summed_over_processes_that_looked_at_once_exactly_the_limit() -> None:
    for limit in range(1, 9):
        for owns in [[a, b, c] for a in range(5) for b in range(5) for c in range(5)]:
            total = sum(owns)
            if total > limit:
                continue
            for key in ("a", "b", "c"):  # the remainder goes round with the key
                got = parts(key, limit, total, owns)
                assert sum(got) == limit and all(p >= o for p, o in zip(got, owns, strict=True))
    turns = {tuple(parts(key, 1, 0, [0, 0, 0])) for key in "abcdefgh"}
    assert turns == {(1, 0, 0), (0, 1, 0), (0, 0, 1)}  # not always the same process


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_older_answer_never_overwrites_a_newer_look_or_a_release() -> None:
    clock = Clock()
    seen = Sightings(clock)
    key = "k5"  # rank 0 takes the remainder first for this key, rank 1 after
    assert seen.limit(key, 4, 2, 1) == 2  # never looked: an idle key
    seen.saw(key, 4, 3, asked=10.0)
    assert seen.limit(key, 4, 2, 1) == 3
    seen.saw(key, 2, 1, asked=9.0)  # asked before the last: ignored
    assert seen.limit(key, 4, 2, 1) == 3
    seen.released(key)  # one of its own let go: (3, 2), one free, not its turn
    assert (seen.limit(key, 4, 2, 1), seen.limit(key, 4, 2, 0)) == (2, 3)
    seen.saw(key, 4, 3, asked=50.0)  # a renewal asked before the release: ignored
    assert seen.limit(key, 4, 2, 1) == 2
    clock.now += 31  # a look older than SEEN_S is forgotten
    assert seen.limit(key, 4, 2, 1) == 2 and seen.limit(key, 4, 1, 0) == 4
