"""What the harness measures about one request, whatever the transport.

Times are `time.perf_counter_ns()` values (CLOCK_MONOTONIC on Linux, so comparable across
the harness's processes). Worker stamps are Unix ns (`worker_time_ns`); `WALL_OFFSET_NS`
turns a monotonic reading into wall-clock time without a second clock call per read.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

WALL_OFFSET_NS = time.time_ns() - time.perf_counter_ns()


def refresh_wall_offset() -> None:
    """Re-read the wall/monotonic offset (call at the start of each run)."""
    global WALL_OFFSET_NS
    WALL_OFFSET_NS = time.time_ns() - time.perf_counter_ns()


@dataclass(slots=True)
class RequestRecord:
    """One request's measurements. `error` is "" for success, else an error kind."""

    target: str = ""
    start_ns: int = 0  # just before the request bytes were written / the RPC started
    first_ns: int = 0  # first event that carried generated text
    end_ns: int = 0  # last byte / final message
    event_ns: list[int] = field(default_factory=list)  # arrival of each token-bearing event
    stamp_lat_ns: list[int] = field(default_factory=list)  # receive - worker_time_ns, per event
    stamp_at_ns: list[int] = field(default_factory=list)  # the receive time of each of those
    tokens: int = 0  # completion tokens: from usage when reported, else token events
    usage_tokens: bool = False  # whether `tokens` came from the server's usage
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from a prefix cache (usage), if reported
    worker: str = ""  # the worker that served it, when the server names it (x-sluice-worker)
    text: str = ""  # the answer, when the driver keeps it (multi-turn workloads)
    rx_bytes: int = 0  # bytes received (SSE: on the socket; gRPC: framed message estimate)
    rx_payload_bytes: int = 0  # SSE: `data:` payload bytes; gRPC: serialized messages
    finish_reason: str = ""
    error: str = ""
    error_detail: str = ""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def ttft_ns(self) -> int | None:
        return self.first_ns - self.start_ns if self.first_ns else None

    @property
    def e2e_ns(self) -> int:
        return self.end_ns - self.start_ns

    def itl_ns(self) -> list[int]:
        """Gaps between consecutive token-bearing events (0 for events read together)."""
        ev = self.event_ns
        return [b - a for a, b in itertools.pairwise(ev)]

    def fail(self, kind: str, detail: str = "") -> RequestRecord:
        self.error = kind
        self.error_detail = detail[:300]
        if not self.end_ns:
            self.end_ns = time.perf_counter_ns()
        return self
