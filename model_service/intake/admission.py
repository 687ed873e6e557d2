"""Admission control and the worker's queue (ARCHITECTURE.md, priority classes and fair
share): refuse fast with a retry hint rather than queue without bound. Counting here, not
reading the engine's queue, makes a burst of arrivals race-free; the common case (a free
slot, nothing queued) costs a few integer operations and no future."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from model_service.config import AdmissionConfig
from model_service.errors import Overloaded, SluiceError
from model_service.types import EngineStats

RATE_WINDOW_S = 10.0
MIN_RETRY_S = 0.05
MAX_RETRY_S = 30.0
RECENT_S = 30.0  # a class counts as in use this long after its last arrival
HIGH, NORMAL, LOW = 0, 1, 2
CLASS_NAMES = ("high", "normal", "low")
ADMITTED, HELD, DISPATCHED, DISPLACED, RELEASED = range(5)


class DrainRate:
    """Generations finished per second over a trailing window."""

    def __init__(self, window_s: float = RATE_WINDOW_S, clock=time.monotonic) -> None:  # type: ignore[no-untyped-def]
        self._window = window_s
        self._clock = clock
        self._started = clock()
        self._stamps: deque[float] = deque()

    def record(self) -> None:
        self._stamps.append(self._clock())

    def rate(self) -> float:
        now = self._clock()
        while self._stamps and self._stamps[0] < now - self._window:
            self._stamps.popleft()
        span = min(self._window, max(now - self._started, 1e-3))
        return len(self._stamps) / span


@dataclass(eq=False, slots=True)
class Ticket:
    """One admitted generation's place: its class, tenant and where it is."""

    priority: int
    tenant: str
    state: int = ADMITTED
    # How to end the generation if it is displaced while queued (set by the core).
    displace: Callable[[SluiceError], None] | None = None
    # While queued: resolved when it leaves the queue (dispatched, displaced or gone).
    # Await it shielded: the generation's task and its RPC both wait on it.
    turn: asyncio.Future[None] | None = None

    def left_queue(self) -> None:
        if self.turn is not None and not self.turn.done():
            self.turn.set_result(None)


@dataclass(slots=True)
class _Class:
    """One priority class: who holds its places, and its queue by tenant."""

    in_flight: int = 0
    tenants: dict[str, int] = field(default_factory=dict)  # in flight, by tenant
    # Queued tickets by tenant, tenants in turn order (the next one first).
    queue: dict[str, deque[Ticket]] = field(default_factory=dict)
    queued: int = 0
    seen: float = -RECENT_S  # the last arrival (monotonic clock)
    # The most it held at once in this window of `recent_s` and the one before.
    peak: int = 0
    peak_before: int = 0
    peak_since: float = -RECENT_S

    def note_peak(self, now: float, window: float) -> None:
        if now - self.peak_since >= window:
            self.peak_before = self.peak if now - self.peak_since < 2 * window else 0
            self.peak, self.peak_since = self.in_flight, now
        elif self.in_flight > self.peak:
            self.peak = self.in_flight

    def recent_peak(self) -> int:
        return max(self.peak, self.peak_before)


class Admission:
    """Admits, queues and dispatches generations (see the module docstring)."""

    def __init__(
        self,
        config: AdmissionConfig,
        clock: Callable[[], float] = time.monotonic,
        recent_s: float = RECENT_S,
    ) -> None:
        self.config = config
        self.recent_s = recent_s
        self.in_flight = 0
        self.dispatched = 0  # handed to the engine, not ended
        self.queued = 0
        self.finished_total = 0
        self.rejected_total = 0
        self.displaced_total = 0
        self.drain = DrainRate()
        self._clock = clock
        self._classes = [_Class() for _ in CLASS_NAMES]
        self._slots = 0  # the engine's batch slots, as last seen by `admit`
        self._timer: asyncio.TimerHandle | None = None  # `pump` when a headroom lapses

    # -- admission ------------------------------------------------------------------

    def admit(self, stats: EngineStats, priority: int = NORMAL, tenant: str = "") -> Ticket:
        """Take one place or raise Overloaded with a retry hint from the drain rate."""
        cls = self._classes[priority]
        now = self._clock()
        cls.seen = now
        self._slots = stats.max_running
        capacity = stats.max_running + self.config.max_waiting
        waiting = stats.waiting + self.queued  # the engine's queue and the worker's
        kv_full = stats.kv_cache_usage >= self.config.kv_high_watermark and waiting > 0
        if kv_full or self.in_flight >= capacity - self._reserve(priority, now):
            if kv_full or not self._displace_for(priority, tenant):
                self.rejected_total += 1
                ahead = max(1, self.in_flight - stats.max_running + 1)
                retry = self.retry_after_s(ahead)
                why = "KV cache is full" if kv_full else f"{self.in_flight} generations in flight"
                raise Overloaded(
                    f"worker overloaded ({why}); retry in {retry:.2f}s", retry_after_s=retry
                )
        self.in_flight += 1
        cls.in_flight += 1
        cls.tenants[tenant] = cls.tenants.get(tenant, 0) + 1
        cls.note_peak(now, self.recent_s)
        return Ticket(priority, tenant)

    def _reserve(self, priority: int, now: float) -> int:
        """Places and slots kept for the classes above `priority` that are in use."""
        if priority == HIGH:
            return 0
        above = [c for c in self._classes[:priority] if now - c.seen < self.recent_s]
        if not above:
            return 0
        fixed = self.config.priority_headroom
        if fixed is not None:
            return fixed * len(above)
        # Auto: room for each class above to reach one more than its recent peak.
        kept = sum(max(1, c.recent_peak() + 1 - c.in_flight) for c in above)
        return min(kept, self._slots // 2)

    def _displace_for(self, priority: int, tenant: str) -> bool:
        """Refuse a queued generation in favour of an arrival: the newest of the lowest
        class below it, else (same class) of the tenant holding most, if that holds at
        least two more than `tenant`. Returns whether one was displaced."""
        for p in range(len(self._classes) - 1, priority, -1):
            cls = self._classes[p]
            if cls.queued:
                self._displace(cls, max(cls.queue, key=cls.tenants.__getitem__), "priority")
                return True
        cls = self._classes[priority]
        if not cls.queued:
            return False
        top = max(cls.queue, key=cls.tenants.__getitem__)
        if cls.tenants[top] < cls.tenants.get(tenant, 0) + 2:
            return False
        self._displace(cls, top, "fair share")
        return True

    def _displace(
        self, cls: _Class, tenant: str, why: str = "", err: SluiceError | None = None
    ) -> None:
        tickets = cls.queue[tenant]
        ticket = tickets.pop()  # the newest
        if not tickets:
            del cls.queue[tenant]
        cls.queued -= 1
        self.queued -= 1
        self._forget(cls, ticket)
        ticket.state = DISPLACED
        if err is None:
            self.displaced_total += 1
            retry = self.retry_after_s(max(1, self.queued))
            err = Overloaded(
                f"worker overloaded: queued generation displaced ({why}); retry in {retry:.2f}s",
                retry_after_s=retry,
            )
        if ticket.displace is not None:
            ticket.displace(err)
        ticket.left_queue()

    def _forget(self, cls: _Class, ticket: Ticket) -> None:
        self.in_flight -= 1
        cls.in_flight -= 1
        left = cls.tenants[ticket.tenant] - 1
        if left:
            cls.tenants[ticket.tenant] = left
        else:
            del cls.tenants[ticket.tenant]

    # -- the queue ------------------------------------------------------------------

    def dispatch(self, ticket: Ticket) -> asyncio.Future[None] | None:
        """Hand the generation to the engine now (None) or queue it: the future resolves
        at its turn. A generation cancelled while queued must still be `release`d."""
        p = ticket.priority
        gate = self._gate(p, self._clock())
        if self.dispatched < gate and not any(c.queued for c in self._classes[: p + 1]):
            self.dispatched += 1
            ticket.state = DISPATCHED
            return None
        cls = self._classes[p]
        tickets = cls.queue.get(ticket.tenant)
        if tickets is None:
            tickets = cls.queue[ticket.tenant] = deque()
        tickets.append(ticket)
        cls.queued += 1
        self.queued += 1
        ticket.state = HELD
        ticket.turn = asyncio.get_running_loop().create_future()
        self.pump()
        return ticket.turn if ticket.state == HELD else None

    def _gate(self, priority: int, now: float) -> int:
        """How many dispatched generations leave room for one more of this class (always
        at least one: a headroom never starves a class outright)."""
        return max(1, self._slots - self._reserve(priority, now))

    def pump(self) -> None:
        """Dispatch queued generations while slots allow: classes in order, tenants in
        turn within a class. Also run by a timer when a headroom that holds the queue
        back lapses (the class above it stopped arriving)."""
        now = self._clock()
        while self.queued:
            p = next(p for p, c in enumerate(self._classes) if c.queued)
            cls = self._classes[p]
            if self.dispatched >= self._gate(p, now):
                if self.dispatched < self._slots:  # only a headroom holds it back
                    self._pump_when_headroom_lapses(p, now)
                return
            tenant = next(iter(cls.queue))
            tickets = cls.queue.pop(tenant)
            ticket = tickets.popleft()
            if tickets:
                cls.queue[tenant] = tickets  # to the end of the turn order
            cls.queued -= 1
            self.queued -= 1
            self.dispatched += 1
            ticket.state = DISPATCHED
            ticket.left_queue()

    def _pump_when_headroom_lapses(self, priority: int, now: float) -> None:
        if self._timer is not None:
            return
        recent = self.recent_s
        ends = [c.seen + recent for c in self._classes[:priority] if now - c.seen < recent]
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(max(0.0, min(ends, default=now) - now) + 0.001, self._lapsed)

    def _lapsed(self) -> None:
        self._timer = None
        self.pump()

    def refuse_queued(self, err: SluiceError) -> int:
        """End every queued generation with `err` (a draining worker: they have not
        reached the engine, so the caller may start them elsewhere at once)."""
        n = 0
        for cls in self._classes:
            while cls.queue:
                self._displace(cls, next(iter(cls.queue)), err=err)
                n += 1
        return n

    # -- the end --------------------------------------------------------------------

    def unadmit(self, ticket: Ticket) -> None:
        """Give back a place taken by a start that never became a generation."""
        self._forget(self._classes[ticket.priority], ticket)

    def release(self, ticket: Ticket) -> None:
        """One admitted generation ended (any reason, displaced ones included)."""
        state = ticket.state
        if state in (DISPLACED, RELEASED):
            return  # a displaced one's place went to the generation that displaced it
        cls = self._classes[ticket.priority]
        if state == DISPATCHED:
            self.dispatched -= 1
            self.finished_total += 1
            self.drain.record()
        elif state == HELD:  # cancelled while queued (client gone, deadline)
            tickets = cls.queue[ticket.tenant]
            tickets.remove(ticket)
            if not tickets:
                del cls.queue[ticket.tenant]
            cls.queued -= 1
            self.queued -= 1
            ticket.left_queue()
        ticket.state = RELEASED
        self._forget(cls, ticket)
        if self.queued:
            self.pump()

    def retry_after_s(self, ahead: int) -> float:
        """Time for `ahead` generations to drain at the recent rate."""
        rate = self.drain.rate()
        if rate <= 0:
            return 1.0
        return min(MAX_RETRY_S, max(MIN_RETRY_S, ahead / rate))
