"""The `Generate` bidi stream: reads client messages, starts generations, forwards their
replay logs to the client.

Generations run in their own tasks (see `generation.py`); this stream is one consumer of
each. One writer (the RPC's own coroutine) drains a bounded queue that per-generation
forwarders fill, so writes never interleave. When the RPC ends early, the forwarders stop
and each generation detaches (it may then be resumed, or it aborts after its grace).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

import grpc

from generated import sluice_pb2 as pb
from model_service import convert
from model_service.core import WorkerCore
from model_service.errors import EngineError, FailedPrecondition, InvalidArgument, SluiceError
from model_service.generation import CLIENT_CANCEL, Generation
from model_service.logs import trace_id
from model_service.status import abort_with
from model_service.types import FinishReason

log = logging.getLogger("sluice.worker")

# Small, so that a lagging multiplexed client leaves tokens in the generations' logs,
# where they merge into fewer, larger messages.
QUEUE_SIZE = 16
ACCEPTED_KEY = "x-sluice-request-id"
ERROR = pb.FINISH_REASON_ERROR


@dataclass(slots=True)
class _GenDone:
    gen: Generation


@dataclass(slots=True)
class _Fatal:
    error: SluiceError


class _ReaderDone:
    pass


_READER_DONE = _ReaderDone()
_Item = pb.GenerateResponse | Generation | _GenDone | _Fatal | _ReaderDone


async def follow_simple(
    gen: Generation, from_index: int
) -> AsyncGenerator[pb.GenerateResponse, None]:
    """A generation's messages for a one-generation consumer: a failure raises its error
    (which becomes the RPC status) instead of arriving as an in-band final message."""
    async with aclosing(gen.follow(from_index)) as msgs:
        async for msg in msgs:
            if msg.final.reason == ERROR and gen.error is not None:
                raise gen.error
            yield msg


class GenerateStream:
    """State of one `Generate` RPC."""

    def __init__(
        self,
        core: WorkerCore,
        requests: AsyncIterator[pb.GenerateRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        self.core = core
        self.requests = requests
        self.context = context
        self.queue: asyncio.Queue[_Item] = asyncio.Queue(QUEUE_SIZE)
        self.live: dict[str, Generation] = {}
        self.forwarders: dict[Generation, asyncio.Task[None]] = {}
        self.multiplexed: bool | None = None  # decided by the first start
        self.trace_id = trace_id(context.invocation_metadata())
        self.started = 0

    async def responses(self) -> AsyncIterator[pb.GenerateResponse]:
        """The RPC's response stream."""
        reader = asyncio.create_task(self._read())
        reader_done = False
        try:
            while True:
                item = await self.queue.get()
                if isinstance(item, pb.GenerateResponse):
                    yield item
                    continue
                if isinstance(item, _Fatal):
                    await abort_with(self.context, item.error)
                if isinstance(item, Generation):
                    # Simple mode: the writer follows the one generation's log itself, so
                    # tokens produced while a write is in flight merge into one message.
                    try:
                        async with aclosing(follow_simple(item, 0)) as msgs:
                            async for msg in msgs:
                                yield msg
                    except SluiceError as err:
                        await abort_with(self.context, err)
                    return
                if isinstance(item, _ReaderDone):
                    reader_done = True
                elif isinstance(item, _GenDone):
                    # Only if it is still this generation: a finished id may be reused.
                    done, rid = item.gen, item.gen.request_id
                    if self.live.get(rid) is done:
                        del self.live[rid]
                    self.forwarders.pop(done, None)
                if reader_done and not self.live:
                    if self.started == 0:
                        await abort_with(
                            self.context,
                            InvalidArgument("start", "stream closed before any start message"),
                        )
                    return
        finally:
            reader.cancel()
            tasks = list(self.forwarders.values())
            for t in tasks:
                t.cancel()  # the generations detach; they are not cancelled here
            await asyncio.gather(reader, *tasks, return_exceptions=True)
            # A generation whose consumer never got to follow it (the RPC ended between
            # launch and the first read) detaches here, or it would run unwatched.
            for gen in self.live.values():
                gen.detach_if_unfollowed()

    async def _read(self) -> None:
        try:
            async for msg in self.requests:
                which = msg.WhichOneof("action")
                if which == "start":
                    await self._start(msg.start)
                elif which == "cancel":
                    gen = self.live.get(msg.cancel.request_id)
                    if gen is not None:
                        gen.cancel(CLIENT_CANCEL)
                else:
                    await self.queue.put(
                        _Fatal(InvalidArgument("action", "set `start` or `cancel`"))
                    )
                    return
        except asyncio.CancelledError:
            raise
        except Exception:  # the transport failed; the writer side sees the RPC end
            log.debug("request stream ended with an error", exc_info=True)
        await self.queue.put(_READER_DONE)

    async def _start(self, start: pb.StartGeneration) -> None:
        if self.multiplexed is None:
            self.multiplexed = start.multiplexed
        elif not self.multiplexed:
            second = FailedPrecondition(
                "this stream carries one generation; set multiplexed=true on its first start"
            )
            for gen in self.live.values():
                gen.cancel(second)
            if not self.live:
                await self.queue.put(_Fatal(second))
            return
        self.started += 1
        try:
            if len(self.live) >= self.core.config.limits.max_generations_per_stream:
                raise FailedPrecondition("too many live generations on this stream")
            gen = await self.core.prepare(start, self.context.time_remaining(), self.trace_id)
        except Exception as exc:
            err: SluiceError
            if isinstance(exc, SluiceError):
                err = exc
            else:  # a worker bug: INTERNAL for this generation, never a hung stream
                log.exception("preparing generation %r failed", start.request_id)
                err = EngineError("the worker failed to start the generation")
            self.core.refused(err, start.request_id, self.trace_id)
            await self._refuse(start.request_id, err)
            return
        self.live[gen.request_id] = gen
        self.core.launch(gen)
        if self.multiplexed:
            self.forwarders[gen] = asyncio.create_task(self._forward(gen))
        else:
            # Tells the caller the generation was accepted before any token exists: a
            # caller may then drop the RPC and `Resume` later (within the detach grace).
            await self.context.send_initial_metadata(((ACCEPTED_KEY, gen.request_id),))
            await self.queue.put(gen)

    async def _refuse(self, request_id: str, err: SluiceError) -> None:
        """A start that never became a generation."""
        if self.multiplexed:
            zero = (0, 0, 0)
            msg = convert.final_to_pb(request_id, 0, FinishReason.ERROR, zero, zero, error=err)
            await self.queue.put(msg)
        else:
            await self.queue.put(_Fatal(err))

    async def _forward(self, gen: Generation) -> None:
        """Multiplexed mode: one generation's log into the shared writer queue."""
        async with aclosing(gen.follow(0)) as msgs:
            async for msg in msgs:
                await self.queue.put(msg)
        await self.queue.put(_GenDone(gen))
