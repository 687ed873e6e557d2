"""The replay store's eviction rule: retention after the end, oldest-ended first over the cap."""

from dataclasses import dataclass

import pytest

from model_service.errors import AlreadyExists
from model_service.generation.store import ReplayStore


@dataclass(eq=False)
class Gen:
    request_id: str
    log_bytes: int = 100
    ended: bool = False


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def test_retention_after_end_then_gone():
    clock = Clock()
    store = ReplayStore(retention_s=10, max_bytes=10_000, clock=clock)
    g = Gen("a")
    store.add(g)
    clock.t = 100  # live generations never expire
    assert store.get("a") is g
    store.ended(g)
    clock.t = 109
    assert store.get("a") is g
    clock.t = 111
    assert store.get("a") is None and len(store) == 0


def test_over_cap_evicts_oldest_ended_never_live():
    store = ReplayStore(retention_s=1000, max_bytes=250, clock=Clock())
    live = Gen("live", log_bytes=100)
    store.add(live)
    first, second = Gen("first"), Gen("second")
    for g in (first, second):
        store.add(g)
        store.ended(g)
    # 300 bytes > 250: the first to end goes, the live one stays.
    assert store.get("first") is None
    assert store.get("second") is second and store.get("live") is live
    assert store.evicted_total == 1


def test_live_id_conflict_and_reuse_of_finished_id():
    store = ReplayStore(retention_s=10, max_bytes=10_000, clock=Clock())
    a = Gen("a")
    store.add(a)
    with pytest.raises(AlreadyExists):
        store.add(Gen("a"))
    store.ended(a)
    b = Gen("a")
    store.add(b)  # replaces the finished log
    assert store.get("a") is b and len(store) == 1


def test_running_logs_over_the_cap_refuse_new_generations():
    """Issue 12, defect 9: the cap bounded only ended generations; running ones grew on."""
    from model_service.errors import Overloaded

    clock = Clock()
    store = ReplayStore(retention_s=1000, max_bytes=250, clock=clock)
    big = Gen("big", log_bytes=100)
    store.add(big)
    store.admit()  # under the cap
    big.log_bytes += 200  # it ran on (a detached generation nobody reads)...
    store.live_bytes += 200  # ...and told the store (its Ledger)
    with pytest.raises(Overloaded) as err:
        store.admit()
    assert err.value.retryable and "replay-max-mb" in err.value.message
    assert store.refused_total == 1
    store.ended(big)  # ended logs are evicted instead, so new work is admitted again
    store.admit()


def test_live_logs_count_as_they_grow_without_summing_them():
    store = ReplayStore(retention_s=1000, max_bytes=250, clock=Clock())
    live = Gen("live", log_bytes=0)
    store.add(live)
    live.log_bytes += 200  # what a generation does as it logs...
    store.live_bytes += 200  # ...and tells the store (its Ledger)
    done = Gen("done")
    store.add(done)
    store.ended(done)
    # 200 live + 100 ended > 250: the ended one goes (the live total was not summed).
    assert store.get("done") is None and store.evicted_total == 1 and store.bytes() == 200
    store.ended(live)
    assert store.live_bytes == 0 and store.bytes() == 200
