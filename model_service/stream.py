"""The `Generate` bidi stream: reads client messages, runs generations, writes responses.

One writer (the RPC's own coroutine) drains a bounded queue that generation tasks fill, so
writes never interleave and a slow reader applies backpressure all the way to the engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from generated import sluice_pb2 as pb
from model_service import convert
from model_service.errors import FailedPrecondition, InvalidArgument, SluiceError
from model_service.generation import CLIENT_CANCEL, Generation, WorkerCore
from model_service.status import abort_with
from model_service.types import FinishReason

log = logging.getLogger("sluice.worker")

QUEUE_SIZE = 256


@dataclass(slots=True)
class _GenDone:
    gen: Generation
    error: SluiceError | None


@dataclass(slots=True)
class _Fatal:
    error: SluiceError


class _ReaderDone:
    pass


_READER_DONE = _ReaderDone()
_Item = pb.GenerateResponse | _GenDone | _Fatal | _ReaderDone


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
        self.multiplexed: bool | None = None  # decided by the first start
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
                if isinstance(item, _ReaderDone):
                    reader_done = True
                elif isinstance(item, _GenDone):
                    self.live.pop(item.gen.request_id, None)
                    if not self.multiplexed:
                        if item.error is not None:
                            await abort_with(self.context, item.error)
                        return
                if reader_done and not self.live:
                    if self.started == 0:
                        await abort_with(
                            self.context,
                            InvalidArgument("start", "stream closed before any start message"),
                        )
                    return
        finally:
            reader.cancel()
            tasks = [g.task for g in self.live.values() if g.task is not None]
            for t in tasks:
                t.cancel()
            await asyncio.gather(reader, *tasks, return_exceptions=True)

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
        except Exception:  # the transport failed; the writer side will see the RPC end
            log.debug("request stream ended with an error", exc_info=True)
            return
        await self.queue.put(_READER_DONE)

    async def _start(self, start: pb.StartGeneration) -> None:
        if self.multiplexed is None:
            self.multiplexed = start.multiplexed
        elif not self.multiplexed:
            await self.queue.put(
                _Fatal(
                    FailedPrecondition(
                        "this stream carries one generation; "
                        "set multiplexed=true on its first start"
                    )
                )
            )
            return
        self.started += 1
        rid = start.request_id
        try:
            if rid in self.live:
                raise FailedPrecondition(
                    f"request_id {rid!r} is already live on this stream", field="request_id"
                )
            if len(self.live) >= self.core.config.limits.max_generations_per_stream:
                raise FailedPrecondition("too many live generations on this stream")
            gen = await self.core.prepare(start, self.context.time_remaining())
        except SluiceError as err:
            await self._refuse(rid, err)
            return
        self.live[gen.request_id] = gen
        gen.task = asyncio.create_task(self._run(gen))

    async def _refuse(self, request_id: str, err: SluiceError) -> None:
        """A start that never became a generation."""
        if self.multiplexed:
            msg = convert.final_to_pb(
                request_id, 0, FinishReason.ERROR, (0, 0, 0), (0, 0, 0), error=err
            )
            await self.queue.put(msg)
        else:
            await self.queue.put(_Fatal(err))

    async def _run(self, gen: Generation) -> None:
        error: SluiceError | None = None
        try:
            await gen.run(self.queue.put)
        except SluiceError as err:
            error = err
            if self.multiplexed:
                await self.queue.put(gen.final(FinishReason.ERROR, error=err))
        await self.queue.put(_GenDone(gen, error))
