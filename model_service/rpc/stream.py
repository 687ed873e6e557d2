"""The consumers of generations' logs: the `Generate` RPC (simple or multiplexed) and
`Resume` (`send_log`). The RPC's own coroutine is its only writer, writing the log's bytes
with no queue or generator in between; a reader task watches the request stream."""

from __future__ import annotations

import asyncio
import logging
from collections import deque

import grpc

from generated import sluice_pb2 as pb
from model_service.core import WorkerCore
from model_service.errors import EngineError, FailedPrecondition, InvalidArgument, SluiceError
from model_service.generation import messages
from model_service.generation.run import CLIENT_CANCEL, Generation
from model_service.intake.admission import DISPLACED
from model_service.obs import tracing
from model_service.obs.logs import trace_id
from model_service.rpc.status import abort_with
from model_service.types import FinishReason
from sluice_common.contract import ACCEPTED_KEY
from sluice_common.wakeup import Wakeup

log = logging.getLogger("sluice.worker")

EOF = grpc.aio.EOF
NO_ACTION = "set `start` or `cancel`"
ONE_GENERATION = "this stream carries one generation; set multiplexed=true on its first start"
NO_USAGE = (0, 0, 0)


async def send_log(gen: Generation, i: int, context: grpc.aio.ServicerContext) -> None:
    """Write `gen`'s log from index `i` on, live until its final message, for a consumer
    of one generation (attached by the caller). A failed generation raises its error,
    which becomes the RPC's status, instead of sending the in-band final."""
    write, take = context.write, gen.log.take
    while True:
        n = gen.index
        while i < n:
            if i == n - 1 and gen.ended and gen.error is not None:
                raise gen.error
            await write(take(i))
            i += 1
            n = gen.index
        if gen.ended:
            return
        await gen.changed()


async def prepare_start(
    core: WorkerCore,
    start: pb.StartGeneration,
    deadline_s: float | None,
    trace_id: str,
    trace_headers: dict[str, str] | None,
    refusal: SluiceError | None = None,
) -> Generation:
    """Prepare and launch one start (or refuse it with `refusal`); a refusal is counted,
    logged and raised."""
    try:
        if refusal is not None:
            raise refusal
        gen = await core.prepare(start, deadline_s, trace_id)
        gen.request.trace_headers = trace_headers
    except Exception as exc:
        err: SluiceError
        if isinstance(exc, SluiceError):
            err = exc
        else:  # a worker bug: INTERNAL for this generation, never a hung stream
            log.exception("preparing generation %r failed", start.request_id)
            err = EngineError("the worker failed to start the generation")
        core.refused(err, start.request_id, trace_id)
        raise err from None
    core.launch(gen)
    return gen


class GenerateStream:
    """One `Generate` RPC; `run()` is its handler (grpc's reader/writer API)."""

    def __init__(self, core: WorkerCore, context: grpc.aio.ServicerContext) -> None:
        self.core = core
        self.context = context
        self.trace_id = trace_id(context.invocation_metadata())
        self.trace_headers = tracing.headers(context.invocation_metadata())
        self.started = 0

    async def run(self) -> None:
        start = await self._first_start()
        if start.multiplexed:
            await _Multiplexed(self).run(start)
            return
        try:
            gen = await self.prepare(start)
        except SluiceError as err:
            await abort_with(self.context, err)
        gen.attach()
        reader = asyncio.create_task(self._watch(gen))
        accepted = False
        try:
            ticket = gen.ticket
            if ticket is not None and ticket.turn is not None and not ticket.turn.done():
                # Queued in the worker: accepted once it reaches the engine, so one that
                # is displaced meanwhile is refused (RESOURCE_EXHAUSTED, no metadata) and
                # the caller may still retry it elsewhere as any refusal.
                await asyncio.shield(ticket.turn)
            if ticket is None or ticket.state != DISPLACED:
                # Tells the caller the generation was accepted before any token exists: a
                # caller may then drop the RPC and `Resume` later (within the detach grace).
                # Accepted before the await: an RPC cancelled inside it may already
                # have given the caller the id, which it may `Resume`.
                accepted = True
                await self.context.send_initial_metadata(((ACCEPTED_KEY, gen.request_id),))
            await send_log(gen, 0, self.context)
        except SluiceError as err:
            await abort_with(self.context, err)
        finally:
            if not accepted and not gen.ended:  # the RPC ended while it was queued: no
                gen.cancel(CLIENT_CANCEL)  # one was told its id, so no one can resume it
            gen.release()
            reader.cancel()  # not awaited: it ends at its next step, nothing to wait for

    async def _first_start(self) -> pb.StartGeneration:
        """Read up to the first start; a `cancel` before it names nothing yet."""
        while True:
            msg = await self.context.read()
            if msg is EOF:
                await abort_with(
                    self.context, InvalidArgument("start", "stream closed before any start message")
                )
            which = msg.WhichOneof("action")
            if which == "start":
                return msg.start
            if which != "cancel":
                await abort_with(self.context, InvalidArgument("action", NO_ACTION))

    async def prepare(self, start: pb.StartGeneration, *, full: bool = False) -> Generation:
        """Prepare and launch one start; a refusal is counted, logged and raised."""
        self.started += 1
        refusal = FailedPrecondition("too many live generations on this stream") if full else None
        deadline = self.context.time_remaining()
        return await prepare_start(
            self.core, start, deadline, self.trace_id, self.trace_headers, refusal
        )

    async def _watch(self, gen: Generation) -> None:
        """Simple mode, after the start: `cancel` ends the generation; another start or
        an unknown action ends it with that error (the RPC's status)."""
        try:
            while (msg := await self.context.read()) is not EOF:
                which = msg.WhichOneof("action")
                if which == "cancel":
                    if msg.cancel.request_id == gen.request_id:
                        gen.cancel(CLIENT_CANCEL)
                elif which == "start":
                    gen.cancel(FailedPrecondition(ONE_GENERATION))
                else:
                    gen.cancel(InvalidArgument("action", NO_ACTION))
                    return
        except Exception:  # the RPC ended or the transport failed: the writer sees it
            log.debug("request stream ended with an error", exc_info=True)


class _Multiplexed:
    """Multiplexed mode: many generations on one RPC, written by one coroutine."""

    def __init__(self, stream: GenerateStream) -> None:
        self.stream = stream
        self.context = stream.context
        self.live: dict[str, Generation] = {}  # by request id, for `cancel`
        self.cursors: dict[Generation, int] = {}  # followed generations: next index to send
        self.ready: dict[Generation, None] = {}  # changed since last written (in order)
        self.outbox: deque[bytes] = deque()  # in-band refusals
        self.fatal: SluiceError | None = None
        self.reader_done = False
        self._wakeup = Wakeup()

    def _notify(self, gen: Generation | None = None) -> None:
        if gen is not None:
            self.ready[gen] = None
        self._wakeup.set()

    async def run(self, first: pb.StartGeneration) -> None:
        reader = asyncio.create_task(self._read(first))
        try:
            await self._write()
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            for gen in self.cursors:
                gen.release(self._notify)  # they detach; they are not cancelled here

    async def _write(self) -> None:
        write = self.context.write
        while True:
            if self.fatal is not None:
                await abort_with(self.context, self.fatal)
            if self.outbox:
                await write(self.outbox.popleft())
            elif self.ready:
                gen = next(iter(self.ready))
                del self.ready[gen]
                i = self.cursors[gen]
                while i < gen.index:
                    raw = gen.log.take(i)
                    i += 1
                    self.cursors[gen] = i
                    await write(raw)
                if gen.ended and i == gen.index:
                    self._done(gen)
            elif self.reader_done and not self.cursors:
                return
            else:
                await self._wakeup.wait()

    def _done(self, gen: Generation) -> None:
        """Its final message is written: stop following it."""
        del self.cursors[gen]
        self.ready.pop(gen, None)
        if self.live.get(gen.request_id) is gen:  # a finished id may be reused
            del self.live[gen.request_id]
        gen.release(self._notify)

    async def _read(self, first: pb.StartGeneration) -> None:
        try:
            await self._start(first)
            while (msg := await self.context.read()) is not EOF:
                which = msg.WhichOneof("action")
                if which == "start":
                    await self._start(msg.start)
                elif which == "cancel":
                    gen = self.live.get(msg.cancel.request_id)
                    if gen is not None:
                        gen.cancel(CLIENT_CANCEL)
                else:
                    self.fatal = InvalidArgument("action", NO_ACTION)
                    break
        except asyncio.CancelledError:
            raise
        except Exception:  # the transport failed; the writer side sees the RPC end
            log.debug("request stream ended with an error", exc_info=True)
        self.reader_done = True
        self._notify()

    async def _start(self, start: pb.StartGeneration) -> None:
        full = len(self.live) >= self.stream.core.config.limits.max_generations_per_stream
        try:
            gen = await self.stream.prepare(start, full=full)
        except SluiceError as err:
            final = messages.final_to_pb(
                start.request_id, 0, FinishReason.ERROR, NO_USAGE, NO_USAGE, error=err
            )
            self.outbox.append(final.SerializeToString())
            self._notify()
            return
        self.live[gen.request_id] = gen
        self.cursors[gen] = 0
        gen.attach(self._notify)
        self._notify(gen)
