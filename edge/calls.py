"""The interface a response reads one upstream generation through.

`edge.upstream.GenerateCall` (one RPC on one worker) and `edge.failover.FailoverCall`
(retries and continuations over several workers) both provide it, so `edge.stream` does
not care which one it got.
"""

from __future__ import annotations

from typing import Protocol

from generated import sluice_pb2 as pb


class UpstreamCall(Protocol):
    """One generation's upstream messages, gapless from index 0 to its `final`."""

    async def admitted(self) -> bool:
        """Wait until a worker accepted the generation; False if it ended already."""
        ...

    async def read(self) -> pb.GenerateResponse:
        """The next message; raises `edge.errors.ApiError` for a failure."""
        ...

    async def settle(self, timeout_s: float) -> bool:
        """After `final`: True once the call ended OK."""
        ...

    def cancel(self) -> None:
        """End the call now (a no-op once it ended)."""
        ...
