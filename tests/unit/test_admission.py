"""Admission control: capacity, the worker's queue, priority classes and fair share."""

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_service.config import AdmissionConfig
from model_service.errors import Overloaded, SluiceError
from model_service.intake.admission import (
    DISPATCHED,
    HELD,
    HIGH,
    LOW,
    NORMAL,
    RECENT_S,
    Admission,
    DrainRate,
    Ticket,
)
from model_service.types import EngineStats


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


class Worker:
    """Admission as the core drives it: admit, then dispatch; displaced ones recorded."""

    def __init__(self, slots: int, waiting: int, headroom: int | None = None) -> None:
        self.clock = Clock()
        self.adm = Admission(AdmissionConfig(waiting, priority_headroom=headroom), self.clock)
        self.stats = EngineStats(max_running=slots)
        self.displaced: list[tuple[Ticket, SluiceError]] = []

    def start(self, priority: int = NORMAL, tenant: str = "") -> Ticket:
        t = self.adm.admit(self.stats, priority, tenant)
        t.displace = lambda err, t=t: self.displaced.append((t, err))
        self.adm.dispatch(t)
        return t

    def running(self, tickets: list[Ticket]) -> list[Ticket]:
        return [t for t in tickets if t.state == DISPATCHED]


async def test_capacity_is_slots_plus_waiting_room():
    w = Worker(slots=3, waiting=2)
    tickets = [w.start() for _ in range(5)]
    assert [t.state for t in tickets] == [DISPATCHED] * 3 + [HELD] * 2
    assert (w.adm.in_flight, w.adm.dispatched, w.adm.queued) == (5, 3, 2)
    with pytest.raises(Overloaded) as e:
        w.start()
    assert e.value.retry_after_s > 0 and w.adm.rejected_total == 1
    w.adm.release(tickets[0])  # a slot frees: the oldest queued one gets it
    assert tickets[3].state == DISPATCHED and tickets[3].turn.done()
    w.start()  # and there is a place again
    assert (w.adm.in_flight, w.adm.dispatched, w.adm.queued) == (5, 3, 2)


async def test_a_generation_cancelled_while_queued_gives_its_place_back():
    w = Worker(slots=1, waiting=2)
    first, queued = w.start(), w.start()
    w.adm.release(queued)  # its client left before its turn
    w.adm.release(queued)  # a second release changes nothing
    assert (w.adm.in_flight, w.adm.dispatched, w.adm.queued) == (1, 1, 0)
    w.adm.release(first)
    assert (w.adm.in_flight, w.adm.dispatched, w.adm.queued) == (0, 0, 0)
    assert w.adm.finished_total == 1  # only what ran counts toward the drain rate


async def test_a_queue_held_back_by_headroom_moves_when_the_headroom_lapses():
    adm = Admission(AdmissionConfig(2, priority_headroom=1), recent_s=0.2)  # real clock
    stats = EngineStats(max_running=2)
    high, normal = adm.admit(stats, HIGH), adm.admit(stats, NORMAL)
    assert adm.dispatch(high) is None
    turn = adm.dispatch(normal)  # one slot is free, but it is high's headroom
    assert turn is not None and normal.state == HELD
    await asyncio.wait_for(turn, 5)  # no release: the lapse itself dispatches it
    assert normal.state == DISPATCHED and adm.dispatched == 2


async def test_the_auto_headroom_follows_the_higher_class_recent_peak():
    w = Worker(slots=16, waiting=16)  # no --priority-headroom: auto
    high = [w.start(HIGH) for _ in range(3)]  # high's peak: 3
    for t in high:
        w.adm.release(t)
    low = [w.start(LOW) for _ in range(16)]
    # high holds none now: low leaves it 3 + 1 slots (its peak, and one more)
    assert len(w.running(low)) == 12
    again = [w.start(HIGH) for _ in range(4)]  # all four find a slot at once
    assert w.running(again) == again
    more = w.start(HIGH)  # past its peak + 1: it waits its turn, first in the queue
    assert more.state == HELD
    w.clock.t += 2 * RECENT_S + 1  # high gone quiet: nothing held back any more
    assert w.adm._reserve(LOW, w.clock()) == 0


async def test_the_auto_headroom_keeps_at_most_half_the_slots():
    w = Worker(slots=8, waiting=8)
    high = [w.start(HIGH) for _ in range(8)]  # a peak of 8
    for t in high:
        w.adm.release(t)
    low = [w.start(LOW) for _ in range(8)]
    assert len(w.running(low)) == 4


async def test_with_one_class_in_use_nothing_is_held_back():
    w = Worker(slots=8, waiting=0)
    w.start(HIGH)
    w.clock.t += RECENT_S + 1  # high is no longer in use
    low = [w.start(LOW) for _ in range(7)]
    assert all(t.state == DISPATCHED for t in low)


async def test_lower_classes_leave_headroom_for_higher_ones_in_use():
    w = Worker(slots=8, waiting=8, headroom=2)
    first = w.start(HIGH)  # high and normal are in use
    w.adm.release(w.start(NORMAL))
    low = [w.start(LOW) for _ in range(11)]
    # low keeps 2 x 2 slots and places free: 8 - 4 slots (high holds one), 16 - 4 places
    assert first.state == DISPATCHED and low[:3] == w.running(low)
    assert (w.adm.in_flight, w.adm.dispatched, w.adm.queued) == (12, 4, 8)
    with pytest.raises(Overloaded):
        w.start(LOW)
    normal = w.start(NORMAL)  # normal keeps 2: it may take the 5th and 6th slot
    high = [w.start(HIGH) for _ in range(3)]  # high may take all 8 slots and 16 places
    assert normal.state == DISPATCHED and w.running(high) == high
    assert (w.adm.in_flight, w.adm.dispatched, w.adm.queued) == (16, 8, 8)
    late = w.start(HIGH)  # full: it displaces a queued low one, and waits its turn
    assert late.state == HELD and [t for t, _ in w.displaced] == [low[10]]
    w.adm.release(normal)
    assert late.state == DISPATCHED


async def test_a_higher_class_displaces_the_newest_queued_lower_one():
    w = Worker(slots=2, waiting=2, headroom=0)
    low = [w.start(LOW, "batch") for _ in range(4)]
    assert w.running(low) == low[:2]
    high = w.start(HIGH, "chat")  # the worker is full: the newest queued low one goes
    assert [t for t, _ in w.displaced] == [low[3]]
    err = w.displaced[0][1]
    assert isinstance(err, Overloaded) and "displaced (priority)" in err.message
    assert err.retry_after_s > 0
    assert high.state == HELD and w.adm.displaced_total == 1 and w.adm.in_flight == 4
    w.adm.release(low[3])  # the displaced generation ends: its place is already gone
    assert w.adm.in_flight == 4
    w.adm.release(low[0])  # a slot: high goes before the older queued low one
    assert high.state == DISPATCHED and low[2].state == HELD
    late = w.start(LOW, "batch")
    with pytest.raises(Overloaded):  # nothing lower is queued: the class itself is refused
        w.start(LOW, "batch")
    w.start(HIGH, "chat")  # a higher one still displaces the newest low one
    assert [t for t, _ in w.displaced] == [low[3], late]


async def test_tenants_of_a_class_take_turns_in_the_queue():
    w = Worker(slots=1, waiting=20)
    head = w.start(NORMAL, "a")
    flood = [w.start(NORMAL, "a") for _ in range(6)]
    light = [w.start(NORMAL, "b") for _ in range(2)]
    order = []
    running = head
    for _ in range(8):
        w.adm.release(running)
        (running,) = [t for t in flood + light if t.state == DISPATCHED]
        order.append("a" if running in flood else "b")
    assert order == ["a", "b", "a", "b", "a", "a", "a", "a"]


async def test_a_tenant_holding_fewer_displaces_the_one_holding_most():
    w = Worker(slots=2, waiting=4)
    a = [w.start(NORMAL, "a") for _ in range(6)]  # a holds every place
    b = [w.start(NORMAL, "b") for _ in range(3)]  # each displaces a's newest queued one
    assert [t for t, _ in w.displaced] == [a[5], a[4], a[3]]
    assert "displaced (fair share)" in w.displaced[0][1].message
    with pytest.raises(Overloaded):  # 3 each now: b would hold more than a
        w.start(NORMAL, "b")
    assert [t.state for t in a[:3] + b] == [DISPATCHED, DISPATCHED] + [HELD] * 4
    assert w.adm.in_flight == 6 and w.adm.rejected_total == 1


async def test_a_new_tenant_takes_a_place_from_one_holding_two_more():
    w = Worker(slots=1, waiting=3)
    *_, b2 = (w.start(NORMAL, t) for t in "abab")
    with pytest.raises(Overloaded):  # a holds 2 and b holds 2: no one gains
        w.start(NORMAL, "a")
    w.start(NORMAL, "c")  # c holds none: the first tenant in turn holding 2 gives one
    assert [t for t, _ in w.displaced] == [b2]
    with pytest.raises(Overloaded):  # c holds 1, a 2: 2 < 1 + 2
        w.start(NORMAL, "c")


def test_full_kv_cache_refuses_while_others_wait():
    adm = Admission(AdmissionConfig(max_waiting=10, kv_high_watermark=0.9))
    adm.admit(EngineStats(max_running=4, kv_cache_usage=0.95, waiting=0))
    with pytest.raises(Overloaded):
        adm.admit(EngineStats(max_running=4, kv_cache_usage=0.95, waiting=1))


def test_drain_rate_and_retry_hint_follow_completions():
    clock = Clock()
    clock.t = 0
    rate = DrainRate(window_s=10, clock=clock)
    clock.t = 10
    for _ in range(20):
        rate.record()
    assert rate.rate() == pytest.approx(2.0)
    clock.t = 25  # all out of the window
    assert rate.rate() == 0


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.sampled_from([HIGH, NORMAL, LOW]), st.sampled_from("abc")),
        st.tuples(st.just("end"), st.integers(0, 50), st.just("")),
        st.tuples(st.just("time"), st.integers(0, 40), st.just("")),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(
    ops=OPS,
    slots=st.integers(1, 6),
    waiting=st.integers(0, 6),
    headroom=st.one_of(st.none(), st.integers(0, 2)),
)
def test_counts_stay_consistent_and_no_slot_idles_while_a_queue_waits(
    ops, slots, waiting, headroom
):
    async def run():
        w = Worker(slots, waiting, headroom)
        live: list[Ticket] = []
        for op, a, b in ops:
            if op == "start":
                try:
                    live.append(w.start(a, b))
                except Overloaded:
                    pass
            elif op == "end" and live:
                w.adm.release(live.pop(a % len(live)))
            elif op == "time":
                w.clock.t += a
                w.adm.pump()  # what the headroom timer does, on the test's clock
            gone = {id(t) for t, _ in w.displaced}
            for t in [t for t in live if id(t) in gone]:
                live.remove(t)
                w.adm.release(t)
            adm = w.adm
            assert adm.in_flight == len(live) <= slots + waiting
            assert adm.dispatched == sum(t.state == DISPATCHED for t in live) <= slots
            assert adm.queued == sum(t.state == HELD for t in live)
            for p, cls in enumerate(adm._classes):
                assert cls.in_flight == sum(t.priority == p for t in live)
                assert sum(cls.tenants.values()) == cls.in_flight
            if adm.queued:  # work-conserving: the first class queued has no free slot
                top = min(t.priority for t in live if t.state == HELD)
                assert adm.dispatched >= adm._gate(top, w.clock())
        for t in list(live):
            w.adm.release(t)
        assert (w.adm.in_flight, w.adm.dispatched, w.adm.queued) == (0, 0, 0)

    asyncio.run(run())


async def test_a_full_kv_cache_counts_the_workers_queue_as_waiting():
    w = Worker(slots=1, waiting=4)
    w.adm.config.kv_high_watermark = 0.9
    w.start(), w.start()  # one running, one queued in the worker (the engine's queue: 0)
    w.stats = EngineStats(max_running=1, kv_cache_usage=0.95, waiting=0)
    with pytest.raises(Overloaded, match="KV cache is full"):
        w.start(HIGH)
    assert w.displaced == []  # a full KV cache refuses every class alike


async def test_a_headroom_never_leaves_a_class_without_a_slot():
    w = Worker(slots=2, waiting=4, headroom=2)  # 2 slots, and 2 kept per class above
    high = w.start(HIGH)
    low = [w.start(LOW) for _ in range(2)]
    assert [t.state for t in low] == [HELD, HELD]
    w.adm.release(high)  # both slots idle, high still in use: low gets one, not none
    assert [t.state for t in low] == [DISPATCHED, HELD]


async def test_a_draining_worker_refuses_what_is_still_queued():
    w = Worker(slots=1, waiting=3)
    running = w.start(NORMAL, "a")
    queued = [w.start(NORMAL, "a"), w.start(LOW, "b"), w.start(HIGH, "c")]
    err = Overloaded("draining")  # any error: the server passes UNAVAILABLE
    assert w.adm.refuse_queued(err) == 3
    assert sorted(t.priority for t, e in w.displaced if e is err) == [HIGH, NORMAL, LOW]
    assert all(t.turn.done() for t in queued)
    assert (w.adm.in_flight, w.adm.dispatched, w.adm.queued) == (1, 1, 0)
    assert w.adm.displaced_total == 0  # not counted as displacements for overload
    w.adm.release(running)
    assert (w.adm.in_flight, w.adm.dispatched) == (0, 0)
