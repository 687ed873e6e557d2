"""`SessionPool`: generations fill one session up to `FILL` before the next (one frame per
session and engine step carries them all), then go to the least busy. Sessions marked
closed here, so no RPC starts: only the choice is under test."""

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
