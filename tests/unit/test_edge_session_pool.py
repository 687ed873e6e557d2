"""`SessionPool`: generations fill one session up to `FILL` before the next (one frame per
session and engine step carries them all), then go to the least busy; a session in its
reconnect backoff gets none while another can. Sessions marked closed here, so no RPC
starts: only the choice is under test."""

from __future__ import annotations

from typing import Any

from edge.upstream.session import SessionPool
from generated import sluice_pb2 as pb


async def test_one_session_fills_before_the_next_then_the_least_busy() -> None:
    worker: Any = object()
    pool = SessionPool(worker, size=3, window_bytes=1 << 20)
    for s in pool._sessions:
        s.closed = True  # no RPC: `send` only queues
    fill = SessionPool.FILL

    def counts() -> list[int]:
        return [len(s.calls) for s in pool._sessions]

    calls = [pool.open(pb.StartGeneration(request_id=f"r{i}")) for i in range(fill + 10)]
    assert counts() == [fill, 10, 0]
    for c in calls[:5]:  # five of the first session's end
        c._session.forget(c)
    pool.open(pb.StartGeneration(request_id="again"))
    assert counts() == [fill - 4, 10, 0]  # room again in the first
    for i in range(3 * fill):
        pool.open(pb.StartGeneration(request_id=f"more{i}"))
    # Each filled to FILL in turn, then the least busy (the first among equals) each time.
    assert counts() == [fill + 88, fill + 87, fill + 87]  # 262 past 3 x FILL


async def test_a_session_in_reconnect_backoff_gets_no_generation_while_another_can() -> None:
    worker: Any = object()
    pool = SessionPool(worker, size=2, window_bytes=1 << 20)
    for s in pool._sessions:
        s.closed = True  # no RPC: `send` only queues
    first, second = pool._sessions
    first.backing_off = True
    for i in range(3):
        pool.open(pb.StartGeneration(request_id=f"r{i}"))
    assert [len(s.calls) for s in pool._sessions] == [0, 3]
    second.backing_off = True  # both: the rule as if neither were
    pool.open(pb.StartGeneration(request_id="both"))
    first.backing_off = second.backing_off = False
    pool.open(pb.StartGeneration(request_id="neither"))
    assert [sorted(s.calls) for s in pool._sessions] == [["both", "neither"], ["r0", "r1", "r2"]]
