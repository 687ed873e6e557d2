"""The `sluice.v1.Generation` servicer: a translator between protobuf and the worker core."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

import grpc

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from model_service import convert
from model_service.core import WorkerCore
from model_service.errors import SluiceError, Unavailable
from model_service.status import abort_with
from model_service.stream import ACCEPTED_KEY, GenerateStream, follow_simple
from model_service.types import EngineStats
from model_service.validation import validate_request


class GenerationServicer(pb_grpc.GenerationServicer):
    """Thin: every RPC decodes, calls the core or engine, encodes."""

    def __init__(self, core: WorkerCore) -> None:
        self.core = core

    async def Generate(
        self, request_iterator: AsyncIterator[pb.GenerateRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        async for msg in GenerateStream(self.core, request_iterator, context).responses():
            yield msg

    async def Resume(
        self, request: pb.ResumeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        try:
            gen = self.core.find(request.request_id, request.from_index)
            await context.send_initial_metadata(((ACCEPTED_KEY, gen.request_id),))
            async with aclosing(follow_simple(gen, request.from_index)) as msgs:
                async for msg in msgs:
                    yield msg
        except SluiceError as err:
            await abort_with(context, err)

    async def ListModels(
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsResponse:
        await self._require_ready(context)
        return pb.ListModelsResponse(models=[convert.model_info_to_pb(self.core.engine.model_info)])

    async def Tokenize(
        self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> pb.TokenizeResponse:
        await self._require_ready(context)
        info = self.core.engine.model_info
        try:
            req = convert.tokenize_request_from_pb(request)
            # Same checks as Generate, minus sampling: size limits, roles, model name.
            validate_request(req, info, self.core.config.limits)
            ids = await self.core.engine.tokenize(req)
        except SluiceError as err:
            await abort_with(context, err)
        return pb.TokenizeResponse(token_ids=ids, count=len(ids), max_model_len=info.max_model_len)

    async def GetStats(
        self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.WorkerStats:
        adm = self.core.admission
        stats = self.core.engine.stats() if self.core.ready else None
        if stats is None:
            stats = EngineStats()
        core = self.core
        core.store.evict()
        msg = convert.stats_to_pb(
            stats,
            draining=core.draining,
            finished=adm.finished_total,
            rejected=adm.rejected_total,
            drain_rate=adm.drain.rate(),
        )
        msg.resumed_total = core.resumed_total
        msg.detach_expired_total = core.detach_expired_total
        msg.wasted_tokens_total = core.wasted_tokens_total
        msg.replay_generations = len(core.store)
        msg.replay_bytes = core.store.bytes()
        return msg

    async def _require_ready(self, context: grpc.aio.ServicerContext) -> None:
        if not self.core.ready:
            await abort_with(context, Unavailable("engine is not ready yet"))
