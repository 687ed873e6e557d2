"""Sessions: the edge's generations ride on a few long-lived `Session` RPCs per worker.
`SessionCall` is an `UpstreamCall` (admitted on the in-band acceptance, refusals raised as
the RPC's status, consumed bytes acked, cancel = detach); a session broken while its
worker lives is reopened and every accepted generation re-attached by the next index it
lacks; if the worker is gone every generation fails UNAVAILABLE and failover takes over.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING

import grpc

from edge.errors import (
    ApiError,
    from_rpc_error,
    from_status,
    from_status_code_number,
    internal_error,
)
from generated import sluice_pb2 as pb
from sluice_common.wakeup import Wakeup

if TYPE_CHECKING:
    from edge.upstream.calls import Sink
    from edge.upstream.worker import Worker

log = logging.getLogger("sluice.edge")

RECONNECT_BACKOFF_S = (0.05, 2.0)


class SessionCall:
    """One generation on a session (see the module docstring)."""

    def __init__(self, session: Session, start: pb.StartGeneration) -> None:
        self.worker = session.worker
        self.request_id = start.request_id
        self._session = session
        self._queue: deque[pb.GenerateResponse] = deque()
        self._wakeup = Wakeup()
        self._wake = self._wakeup.set
        self.accepted = False
        self.sent_on = -1  # the session RPC its start (or attach) went out on
        self.next_index = 0  # the next index due from the worker
        self._error: ApiError | None = None
        self._done = False  # its final was read, it failed, or it was cancelled
        self._ok = False
        self._reattached = False
        self.consumed = 0  # entry bytes read since started or attached (acks)
        self.acked = 0
        self._sink: Sink | None = None  # while the consumer is parked in read(sink)

    # -- fed by the session -------------------------------------------------------------

    def accept(self) -> None:
        self.accepted = True
        self._wake()

    def deliver(self, msg: pb.GenerateResponse) -> None:
        i = msg.index
        if i != self.next_index:
            if i < self.next_index:
                return  # sent again after a re-attach: we have it
            self.fail(
                ApiError(
                    502,
                    f"upstream message {i} arrived where {self.next_index} was due",
                    type="server_error",
                    code="upstream_error",
                )
            )
            return
        self.next_index = i + 1
        sink = self._sink
        if sink is not None and not self._queue and msg.HasField("chunk") and sink.ready():
            # Straight to the client from the session's reader: no wake, no queue.
            self._consume(msg)
            try:
                sink.take(msg)
            except ApiError as err:
                self.fail(err)
            except Exception:
                log.exception("generation %s failed in the edge", self.request_id)
                self.fail(internal_error())
            return
        self._queue.append(msg)
        self._wake()

    def fail(self, err: ApiError) -> None:
        if self._error is None:
            self._error = err
        self._session.forget(self)
        self._wake()

    def reattached(self) -> None:
        self._reattached = True
        self.consumed = self.acked = 0

    # -- UpstreamCall -------------------------------------------------------------------

    async def admitted(self) -> bool:
        while not self.accepted and not self._queue and self._error is None:
            await self._wakeup.wait()
        return self.accepted and self._error is None

    async def read(self, sink: Sink | None = None) -> pb.GenerateResponse:
        queue = self._queue
        if not queue:
            self._sink = sink
            try:
                while not queue:
                    if self._error is not None:
                        self._done = True
                        raise self._error
                    await self._wakeup.wait()
            finally:
                self._sink = None
        msg = queue.popleft()
        if msg.WhichOneof("kind") == "final":
            self._done = True
            self._session.forget(self)
            if msg.final.HasField("error"):
                raise self._final_error(msg.final.error)
            self._ok = True
            return msg
        self._consume(msg)
        return msg

    def _consume(self, msg: pb.GenerateResponse) -> None:
        """Count a chunk handed on; ack every quarter window."""
        self.consumed += msg.ByteSize()
        if self.consumed - self.acked >= self._session.ack_every:
            self.acked = self.consumed
            self._session.send(
                pb.SessionAction(ack=pb.AckGeneration(request_id=self.request_id, bytes=self.acked))
            )

    def _final_error(self, status: pb.Status) -> ApiError:
        code = from_status_code_number(status.code)
        if self._reattached and code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.OUT_OF_RANGE):
            return ApiError(
                502,
                "the generation was lost while its session reconnected",
                type="server_error",
                code="upstream_error",
            )
        return from_status(
            code, status.message, field=status.field, retry_after_ms=status.retry_after_ms
        )

    async def settle(self, timeout_s: float) -> bool:
        return self._ok

    def cancel(self) -> None:
        """The consumer is gone: detach (the worker runs on for the detach grace)."""
        if not self._done:
            self._done = True
            if self._session.forget(self):
                self._session.send(
                    pb.SessionAction(detach=pb.DetachGeneration(request_id=self.request_id))
                )


class Session:
    """One `Session` RPC to a worker, reopened when it breaks (module docstring)."""

    def __init__(self, worker: Worker, window_bytes: int) -> None:
        self.worker = worker
        self.window = window_bytes
        self.ack_every = max(1, window_bytes // 4)
        self.calls: dict[str, SessionCall] = {}
        self._pending: list[pb.SessionAction] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._rpc_seq = 0
        self.closed = False
        self.backing_off = False  # failed twice running: waiting before the next try

    def open(self, start: pb.StartGeneration) -> SessionCall:
        call = SessionCall(self, start)
        self.calls[start.request_id] = call
        self.send(pb.SessionAction(start=start))
        return call

    def send(self, action: pb.SessionAction) -> None:
        self._pending.append(action)
        self._wakeup.set()
        if self._task is None and not self.closed:
            self._task = asyncio.create_task(self._run(), name=f"session {self.worker.address}")

    def forget(self, call: SessionCall) -> bool:
        """Stop routing to `call`; True if it was live here."""
        if self.calls.get(call.request_id) is call:
            del self.calls[call.request_id]
            return True
        return False

    async def close(self) -> None:
        self.closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._fail_all(from_status(grpc.StatusCode.UNAVAILABLE, "the worker left its pool"))

    # -- the RPC's life -----------------------------------------------------------------

    async def _run(self) -> None:
        backoff = RECONNECT_BACKOFF_S[0]
        failures = 0
        try:
            while not self.closed:
                if not self.calls and not self._pending:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                got_frame = await self._one_rpc()
                if got_frame:
                    failures, backoff = 0, RECONNECT_BACKOFF_S[0]
                    continue  # broke after working: reopen at once, attach by index
                failures += 1
                if failures >= 2:  # a reopened session failed too: the worker is gone
                    self._fail_all(
                        from_status(grpc.StatusCode.UNAVAILABLE, "the worker's session failed")
                    )
                    self.backing_off = True
                    try:
                        await asyncio.sleep(backoff)
                    finally:
                        self.backing_off = False
                    backoff = min(backoff * 2, RECONNECT_BACKOFF_S[1])
        finally:
            if self._task is asyncio.current_task():
                self._task = None

    async def _one_rpc(self) -> bool:
        """Run one Session RPC until it ends; True if it delivered at least one frame."""
        self._rpc_seq += 1
        seq = self._rpc_seq
        rpc = self.worker.stub.Session()
        actions = [pb.SessionAction(options=pb.SessionOptions(window_bytes=self.window))]
        for call in list(self.calls.values()):
            if call.sent_on < 0:
                continue  # its start is still pending: it goes out below
            if call.accepted:  # again, from the first index it lacks
                call.reattached()
                call.sent_on = seq
                actions.append(
                    pb.SessionAction(
                        attach=pb.AttachGeneration(
                            request_id=call.request_id, from_index=call.next_index
                        )
                    )
                )
            else:  # its acceptance was in flight: retried before its first token
                call.fail(
                    from_status(grpc.StatusCode.UNAVAILABLE, "the session broke before acceptance")
                )
        got_frame = False
        writer = asyncio.create_task(self._write(rpc, seq, actions))
        try:
            while True:
                frame = await rpc.read()
                if frame is grpc.aio.EOF:
                    break
                got_frame = True
                calls = self.calls
                for rid in frame.accepted:
                    if (found := calls.get(rid)) is not None:
                        found.accept()
                for msg in frame.entries:
                    if (found := calls.get(msg.request_id)) is not None:
                        found.deliver(msg)
        except grpc.aio.AioRpcError as err:
            log.info("session to %s ended: %s", self.worker.address, from_rpc_error(err).message)
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            rpc.cancel()
        return got_frame

    async def _write(
        self, rpc: grpc.aio.StreamStreamCall, seq: int, first: list[pb.SessionAction]
    ) -> None:
        batch = first
        try:
            while True:
                # One turn of the loop first: starts made in it join this write (one gRPC
                # write costs more than all its actions).
                await asyncio.sleep(0)
                pending, self._pending = self._pending, []
                for action in pending:
                    if action.WhichOneof("action") == "start":
                        call = self.calls.get(action.start.request_id)
                        if call is None:
                            continue  # cancelled before it went out
                        call.sent_on = seq
                    batch.append(action)
                if batch:
                    await rpc.write(pb.SessionRequest(actions=batch))
                    batch = []
                if not self._pending:
                    self._wakeup.clear()
                    await self._wakeup.wait()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            # The RPC ended under us (the reader sees why): unsent starts go out again.
            again = [a for a in batch if a.WhichOneof("action") == "start"]
            for action in again:
                call = self.calls.get(action.start.request_id)
                if call is not None:
                    call.sent_on = -1
            self._pending = again + self._pending

    def _fail_all(self, err: ApiError) -> None:
        for call in list(self.calls.values()):
            call.fail(err)
        self._pending = []


class SessionPool:
    """A worker's sessions: a few per edge process. A generation goes on the first session
    with fewer than `FILL` generations, else on the least busy: the worker sends one frame
    per session and engine step, so up to `FILL` generations share each frame (and its
    gRPC read) rather than half of them each. A session waiting out its reconnect backoff
    gets none while another does not."""

    FILL = 256

    def __init__(self, worker: Worker, size: int, window_bytes: int) -> None:
        self._sessions = [Session(worker, window_bytes) for _ in range(max(1, size))]

    def open(self, start: pb.StartGeneration) -> SessionCall:
        sessions = [s for s in self._sessions if not s.backing_off] or self._sessions
        for session in sessions:
            if len(session.calls) < self.FILL:
                return session.open(start)
        return min(sessions, key=lambda s: len(s.calls)).open(start)

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self._sessions))


def open_session_call(
    worker: Worker,
    start: pb.StartGeneration,
    timeout_s: float | None,
    trace_id: str = "",
    traceparent: str = "",
) -> SessionCall:
    """`FailoverCall`'s `open_call` in session mode: the attempt's deadline and trace
    context travel in the start itself."""
    if timeout_s is not None:
        ms = max(1, int(timeout_s * 1000))
        if not start.timeout_ms or ms < start.timeout_ms:
            start.timeout_ms = ms
    start.trace_id = trace_id
    start.traceparent = traceparent
    return worker.sessions.open(start)
