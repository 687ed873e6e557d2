"""The fail-open stream rule (`edge.store.presence`): a process's part of a key's limit
from its last look, and the looks kept newest first."""

from __future__ import annotations

import pytest

from edge.store.presence import Sightings, outage_limit


@pytest.mark.parametrize(
    "limit, total, own, replicas, part",
    [
        (4, 0, 0, 2, 2),  # an idle key: half each
        (4, 4, 3, 2, 3),  # full: each its own, nothing more
        (4, 4, 1, 2, 1),
        (4, 2, 1, 2, 2),  # two free: one each
        (5, 0, 0, 2, 2),  # rounded down: 2 + 2 <= 5
        (1, 0, 0, 2, 0),  # a share below one: none here until Redis is back
        (4, 0, 0, 0, 4),  # no process counted yet: this one alone
        (4, 6, 2, 3, 2),  # more held than the limit (a lowered limit): no free part
    ],
)
def test_a_process_holds_its_own_and_its_part_of_the_free_slots(limit, total, own, replicas, part):
    assert outage_limit(limit, total, own, replicas) == part


def test_summed_over_processes_that_looked_at_once_never_past_the_limit() -> None:
    for limit in range(1, 9):
        for owns in [(a, b, c) for a in range(5) for b in range(5) for c in range(5)]:
            total = sum(owns)
            if total > limit:
                continue
            parts = [outage_limit(limit, total, own, len(owns)) for own in owns]
            assert sum(parts) <= limit and all(p >= o for p, o in zip(parts, owns, strict=True))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_older_answer_never_overwrites_a_newer_look_or_a_release() -> None:
    clock = Clock()
    seen = Sightings(clock)
    assert seen.limit("k", 4, 2) == 2  # never looked: an idle key
    seen.saw("k", 4, 3, asked=10.0)
    assert seen.limit("k", 4, 2) == 3
    seen.saw("k", 2, 1, asked=9.0)  # asked before the last: ignored
    assert seen.limit("k", 4, 2) == 3
    seen.released("k")  # one of its own let go: (3, 2), one free, no whole share
    assert seen.limit("k", 4, 2) == 2
    seen.saw("k", 4, 3, asked=50.0)  # a renewal asked before the release: ignored
    assert seen.limit("k", 4, 2) == 2
    clock.now += 31  # a look older than SEEN_S is forgotten
    assert seen.limit("k", 4, 2) == 2 and seen.limit("k", 4, 1) == 4
