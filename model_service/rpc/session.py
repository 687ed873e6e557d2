"""The `Session` RPC: many generations on one stream, one frame per wakeup.

A reader task applies the client's actions; the RPC's own coroutine is the only writer.
Every generation the session follows tells it of a change (`Generation.attach` with a
listener); the writer wakes once for all changes of one engine step and writes one frame:
the ids accepted since, then every followed generation's new log entries, as the bytes
the log holds (framed by hand as `SessionFrame` fields: nothing is parsed or serialized
again). Each generation has its own window: at most `window` bytes sent beyond what the
client acknowledged, so a client that stops reading one generation leaves it in its log
(bounded by the replay cap) and never stalls the others. A start whose preparation may
wait (a constraint's compile, a large prompt's tokenizing: `core.may_wait`) is prepared
in a task of its own, so the reader goes on with the session's other actions meanwhile.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from generated import sluice_pb2 as pb
from model_service.core import WorkerCore, may_wait
from model_service.errors import AlreadyExists, FailedPrecondition, InvalidArgument, SluiceError
from model_service.generation import messages
from model_service.generation.run import CLIENT_CANCEL, Generation
from model_service.intake.admission import DISPLACED
from model_service.obs import tracing
from model_service.obs.logs import trace_id as metadata_trace_id
from model_service.rpc.stream import prepare_start
from model_service.types import FinishReason
from sluice_common.wakeup import Wakeup

log = logging.getLogger("sluice.worker")

EOF = grpc.aio.EOF
DEFAULT_WINDOW_BYTES = 256 * 1024
FRAME_MAX_BYTES = 1 << 20  # a frame stops growing here (the rest goes in the next one)
NO_USAGE = (0, 0, 0)
# A session that ends while a generation runs (broken, most often: the client reattaches
# by index on a new one) leaves it at least this long, whatever its own detach grace.
SESSION_END_GRACE_S = 5.0
ACCEPTED_TAG = b"\x0a"  # SessionFrame.accepted (1, length-delimited)
ENTRY_TAG = b"\x12"  # SessionFrame.entries (2, length-delimited)


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class _Follow:
    """One generation followed by the session: what was sent and acknowledged."""

    __slots__ = ("acked", "announced", "blocked", "cursor", "gen", "sent")

    def __init__(self, gen: Generation, cursor: int, announced: bool) -> None:
        self.gen = gen
        self.cursor = cursor  # next log index to send
        self.sent = 0  # entry bytes sent on this session
        self.acked = 0  # ... acknowledged by the client
        self.announced = announced  # its id went out in `accepted`
        self.blocked = False  # waiting for an ack (window full)


class SessionStream:
    """One `Session` RPC; `run()` is its handler (see the module docstring)."""

    def __init__(self, core: WorkerCore, context: grpc.aio.ServicerContext) -> None:
        self.core = core
        self.context = context
        metadata = context.invocation_metadata()
        self.trace_id = metadata_trace_id(metadata)
        self.window = DEFAULT_WINDOW_BYTES
        self.follows: dict[str, _Follow] = {}
        self.by_gen: dict[Generation, _Follow] = {}
        self.ready: dict[_Follow, None] = {}  # changed since last written, in order
        self.accepted: list[str] = []  # announced, not yet written
        self.refusals: list[bytes] = []  # in-band finals of refused starts and attaches
        self.pending: dict[str, asyncio.Task[None]] = {}  # starts in preparation (tasks)
        self.attach_from: dict[str, int] = {}  # attaches to those, applied once prepared
        self.reader_done = False
        self._wakeup = Wakeup()
        self._wake = self._wakeup.set

    # -- wakeups ------------------------------------------------------------------------

    def _changed(self, gen: Generation) -> None:
        """A followed generation has a new entry or ended (its listener)."""
        f = self.by_gen.get(gen)
        if f is not None and not f.blocked:
            self.ready[f] = None
            self._wake()

    # -- the RPC ------------------------------------------------------------------------

    async def run(self) -> None:
        reader = asyncio.create_task(self._read())
        try:
            await self._write()
        finally:
            reader.cancel()
            for task in self.pending.values():  # their callers are gone with the session
                task.cancel()
            await asyncio.gather(reader, *self.pending.values(), return_exceptions=True)
            cap = self.core.config.replay.max_detach_grace_s
            for f in list(self.follows.values()):
                gen = f.gen
                gen.detach_grace_s = max(gen.detach_grace_s, min(SESSION_END_GRACE_S, cap))
                self._unfollow(f)  # they detach (their grace runs); not cancelled

    async def _write(self) -> None:
        write = self.context.write
        while True:
            if self.accepted or self.refusals or self.ready:
                # One turn of the loop first: what else is ready now joins this frame
                # (one gRPC write costs more than all its entries).
                await asyncio.sleep(0)
                frame = self._frame()
                if frame:
                    await write(frame)
            elif self.reader_done and not self.follows and not self.pending:
                return
            else:
                await self._wakeup.wait()

    def _frame(self) -> bytes:
        """The next frame: ids accepted, refusals, then every ready generation's entries
        (window and frame size permitting)."""
        entries: list[bytes] = []
        size = 0
        for raw in self.refusals:
            entries += (ENTRY_TAG, _varint(len(raw)), raw)
        self.refusals = []
        ready, self.ready = self.ready, {}
        window = self.window
        for f in ready:
            gen = f.gen
            if not f.announced and not self._announce(f):
                continue  # still queued in the worker: nothing to send yet
            i, n = f.cursor, gen.index
            take = gen.log.take
            while i < n:
                if f.sent - f.acked >= window:
                    f.blocked = True
                    break
                if size >= FRAME_MAX_BYTES:
                    self.ready[f] = None  # the rest in the next frame
                    break
                raw = take(i)
                entries += (ENTRY_TAG, _varint(len(raw)), raw)
                f.sent += len(raw)
                size += len(raw)
                i += 1
            f.cursor = i
            if gen.ended and i == gen.index:
                self._unfollow(f)
        accepted = self.accepted
        if accepted:
            self.accepted = []
            head: list[bytes] = []
            for rid in accepted:
                enc = rid.encode()
                head += (ACCEPTED_TAG, _varint(len(enc)), enc)
            entries = head + entries
        return b"".join(entries)

    def _announce(self, f: _Follow) -> bool:
        """Accepted once it reached the engine's turn; a displaced one ends in-band with
        its refusal. False: still waiting for its turn (told by a callback)."""
        ticket = f.gen.ticket
        turn = ticket.turn if ticket is not None else None
        if turn is not None and not turn.done():
            return False
        if ticket is None or ticket.state != DISPLACED:
            self.accepted.append(f.gen.request_id)
        f.announced = True
        return True

    def _follow(self, gen: Generation, cursor: int, announced: bool) -> None:
        f = _Follow(gen, cursor, announced)
        self.follows[gen.request_id] = f
        self.by_gen[gen] = f
        gen.attach(self._changed)
        ticket = gen.ticket
        turn = ticket.turn if ticket is not None else None
        if not announced and turn is not None and not turn.done():
            turn.add_done_callback(lambda _t: self._changed(gen))
        self.ready[f] = None
        self._wake()

    def _unfollow(self, f: _Follow) -> None:
        gen = f.gen
        if self.follows.get(gen.request_id) is f:
            del self.follows[gen.request_id]
        if self.by_gen.pop(gen, None) is None:
            return
        self.ready.pop(f, None)
        if not f.announced and not gen.ended:  # nobody was told its id: nobody can resume it
            gen.cancel(CLIENT_CANCEL)
        gen.release(self._changed)

    def _refuse(self, request_id: str, index: int, err: SluiceError) -> None:
        final = messages.final_to_pb(
            request_id, index, FinishReason.ERROR, NO_USAGE, NO_USAGE, error=err
        )
        self.refusals.append(final.SerializeToString())
        self._wake()

    # -- actions ------------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            while (msg := await self.context.read()) is not EOF:
                for action in msg.actions:
                    await self._apply(action)
        except asyncio.CancelledError:
            raise
        except Exception:  # the transport failed; the writer side sees the RPC end
            log.debug("session request stream ended with an error", exc_info=True)
        self.reader_done = True
        self._wake()

    async def _apply(self, action: pb.SessionAction) -> None:
        which = action.WhichOneof("action")
        if which == "start":
            await self._start(action.start)
        elif which == "ack":
            f = self.follows.get(action.ack.request_id)
            if f is not None and action.ack.bytes > f.acked:
                f.acked = action.ack.bytes
                if f.blocked and f.sent - f.acked < self.window:
                    f.blocked = False
                    self.ready[f] = None
                    self._wake()
        elif which == "detach":
            f = self.follows.get(action.detach.request_id)
            if f is not None:
                self._unfollow(f)
            self._abandon(action.detach.request_id)
        elif which == "cancel":
            rid = action.cancel.request_id
            f = self.follows.get(rid)
            if f is not None:
                f.gen.cancel(CLIENT_CANCEL)
            if self._abandon(rid):  # never started: it still ends, CANCELLED
                final = messages.final_to_pb(rid, 0, FinishReason.CANCELLED, NO_USAGE, NO_USAGE)
                self.refusals.append(final.SerializeToString())
                self._wake()
        elif which == "attach":
            self._attach(action.attach)
        elif which == "options":
            if action.options.window_bytes:
                self.window = action.options.window_bytes
        else:
            log.debug("session action without a kind ignored")

    async def _start(self, start: pb.StartGeneration) -> None:
        refusal: SluiceError | None = None
        live = len(self.follows) + len(self.pending)
        if live >= self.core.config.limits.max_generations_per_session:
            refusal = FailedPrecondition("too many live generations on this session")
        elif start.request_id in self.follows or start.request_id in self.pending:
            refusal = AlreadyExists(f"generation {start.request_id!r} is live on this session")
        trace_headers = tracing.headers(
            [
                (k, v)
                for k, v in (("traceparent", start.traceparent), ("tracestate", start.tracestate))
                if v
            ]
        )
        prepared = self._prepare(start, trace_headers, refusal)
        if refusal is None and may_wait(start):
            rid = start.request_id
            task = asyncio.get_running_loop().create_task(prepared)
            self.pending[rid] = task
            task.add_done_callback(lambda _t: self._prepared(rid, task))
        else:
            await prepared

    async def _prepare(
        self,
        start: pb.StartGeneration,
        trace_headers: dict[str, str] | None,
        refusal: SluiceError | None,
    ) -> None:
        rid = start.request_id
        try:
            gen = await prepare_start(
                self.core, start, None, start.trace_id or self.trace_id, trace_headers, refusal
            )
        except SluiceError as err:
            self._refuse(rid, 0, err)
        else:
            self._follow(gen, 0, announced=False)
        if self.pending.get(rid) is asyncio.current_task():  # prepared in a task: settled
            del self.pending[rid]
            if (index := self.attach_from.pop(rid, None)) is not None:  # in the client's order
                self._attach(pb.AttachGeneration(request_id=rid, from_index=index))

    def _prepared(self, request_id: str, task: asyncio.Task[None]) -> None:
        if self.pending.get(request_id) is task:
            del self.pending[request_id]
        self._wake()

    def _abandon(self, request_id: str) -> bool:
        """The client left a start still in preparation: its preparation is abandoned.
        True if there was one."""
        task = self.pending.pop(request_id, None)
        self.attach_from.pop(request_id, None)
        if task is None:
            return False
        task.cancel()
        return True

    def _attach(self, attach: pb.AttachGeneration) -> None:
        rid = attach.request_id
        if not rid:
            self._refuse(rid, attach.from_index, InvalidArgument("request_id", "set request_id"))
            return
        if rid in self.pending:  # its start is in preparation: applied after it, in order
            self.attach_from[rid] = attach.from_index
            return
        old = self.follows.get(rid)
        try:
            gen = self.core.find(rid, attach.from_index)
        except SluiceError as err:
            if old is not None:
                self._unfollow(old)
            self._refuse(rid, attach.from_index, err)
            return
        if old is not None and old.gen is gen and not old.announced:
            old.cursor = attach.from_index  # its own start, not yet accepted: nothing sent
            return
        if old is not None:
            self._unfollow(old)
        self.accepted.append(rid)
        self._follow(gen, attach.from_index, announced=True)
