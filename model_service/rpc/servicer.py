"""The `sluice.v1.Generation` servicer: a translator between protobuf and the worker core.
`Generate` and `Resume` write the bytes their generation's log holds, so `add_to_server`
registers them without a response serializer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import grpc

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from model_service.core import WorkerCore
from model_service.errors import SluiceError, Unavailable
from model_service.intake import decode
from model_service.intake.embed import embed_request_from_pb
from model_service.intake.validation import validate_request
from model_service.obs.logs import trace_id
from model_service.rpc import replies
from model_service.rpc.cache import watch_cache
from model_service.rpc.load import LoadReporter, intervals
from model_service.rpc.session import SessionStream
from model_service.rpc.status import abort_with
from model_service.rpc.stream import GenerateStream, send_log
from model_service.types import EngineStats
from sluice_common.contract import ACCEPTED_KEY, SERVICE_NAME


class GenerationServicer(pb_grpc.GenerationServicer):
    """Thin: every RPC decodes, calls the core or engine, encodes."""

    def __init__(self, core: WorkerCore) -> None:
        self.core = core
        self.load = LoadReporter(core)

    async def Generate(
        self, request_iterator: AsyncIterator[pb.GenerateRequest], context: grpc.aio.ServicerContext
    ) -> None:
        # The requests are read with `context.read()` (one hop less than the iterator).
        await GenerateStream(self.core, context).run()

    async def Session(
        self, request_iterator: AsyncIterator[pb.SessionRequest], context: grpc.aio.ServicerContext
    ) -> None:
        await SessionStream(self.core, context).run()

    async def Resume(self, request: pb.ResumeRequest, context: grpc.aio.ServicerContext) -> None:
        try:
            gen = self.core.find(request.request_id, request.from_index)
        except SluiceError as err:
            await abort_with(context, err)
        gen.attach()
        try:
            await context.send_initial_metadata(((ACCEPTED_KEY, gen.request_id),))
            await send_log(gen, request.from_index, context)
        except SluiceError as err:
            await abort_with(context, err)
        finally:
            gen.release()

    async def ListModels(
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsResponse:
        await self._require_ready(context)
        adapters = self.core.adapters
        return replies.models_to_pb(self.core.engine.model_info, adapters, adapters.slots)

    async def LoadAdapter(
        self, request: pb.LoadAdapterRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInfo:
        await self._require_ready(context)
        try:
            adapter = await self.core.load_adapter(request.name, request.path)
        except SluiceError as err:
            await abort_with(context, err)
        return replies.adapter_to_pb(adapter, self.core.engine.model_info)

    async def UnloadAdapter(
        self, request: pb.UnloadAdapterRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnloadAdapterResponse:
        await self._require_ready(context)
        try:
            await self.core.unload_adapter(request.name)
        except SluiceError as err:
            await abort_with(context, err)
        return pb.UnloadAdapterResponse()

    async def Tokenize(
        self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> pb.TokenizeResponse:
        await self._require_ready(context)
        info = self.core.engine.model_info
        try:
            req = decode.tokenize_request_from_pb(request)
            req.adapter = self.core.adapters.resolve(req.model)
            # Same checks as Generate, minus sampling: size limits, roles, model name.
            validate_request(req, info, self.core.config.limits)
            ids = await self.core.engine.tokenize(req)
        except SluiceError as err:
            await abort_with(context, err)
        return pb.TokenizeResponse(token_ids=ids, count=len(ids), max_model_len=info.max_model_len)

    async def Embed(
        self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> pb.EmbedResponse:
        try:
            req = embed_request_from_pb(request)
            vectors, tokens = await self.core.embed(req, trace_id(context.invocation_metadata()))
        except SluiceError as err:
            await abort_with(context, err)
        return replies.embeddings_to_pb(vectors, tokens)

    async def GetStats(
        self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.WorkerStats:
        adm = self.core.admission
        stats = self.core.engine.stats() if self.core.ready else None
        if stats is None:
            stats = EngineStats()
        core = self.core
        core.store.evict()
        stats = replace(stats, waiting=stats.waiting + adm.queued)  # with the worker's queue
        msg = replies.stats_to_pb(
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

    async def WatchLoad(
        self, request: pb.WatchLoadRequest, context: grpc.aio.ServicerContext
    ) -> None:
        min_s, max_s = intervals(request.min_interval_ms, request.max_interval_ms)
        async for msg in self.load.watch(min_s, max_s):
            await context.write(msg)

    async def WatchCache(
        self, request: pb.WatchCacheRequest, context: grpc.aio.ServicerContext
    ) -> None:
        await self._require_ready(context)
        await watch_cache(self.core.engine.cache_log, context)

    async def _require_ready(self, context: grpc.aio.ServicerContext) -> None:
        if not self.core.ready:
            await abort_with(context, Unavailable("engine is not ready yet"))


def method_handlers(servicer: GenerationServicer) -> dict[str, grpc.RpcMethodHandler]:
    """The service's handlers: `Generate`, `Session` and `Resume` write bytes (no serializer)."""
    return {
        "Generate": grpc.stream_stream_rpc_method_handler(
            servicer.Generate,
            request_deserializer=pb.GenerateRequest.FromString,
            response_serializer=None,
        ),
        "Session": grpc.stream_stream_rpc_method_handler(
            servicer.Session,
            request_deserializer=pb.SessionRequest.FromString,
            response_serializer=None,
        ),
        "Resume": grpc.unary_stream_rpc_method_handler(
            servicer.Resume,
            request_deserializer=pb.ResumeRequest.FromString,
            response_serializer=None,
        ),
        "ListModels": grpc.unary_unary_rpc_method_handler(
            servicer.ListModels,
            request_deserializer=pb.ListModelsRequest.FromString,
            response_serializer=pb.ListModelsResponse.SerializeToString,
        ),
        "LoadAdapter": grpc.unary_unary_rpc_method_handler(
            servicer.LoadAdapter,
            request_deserializer=pb.LoadAdapterRequest.FromString,
            response_serializer=pb.ModelInfo.SerializeToString,
        ),
        "UnloadAdapter": grpc.unary_unary_rpc_method_handler(
            servicer.UnloadAdapter,
            request_deserializer=pb.UnloadAdapterRequest.FromString,
            response_serializer=pb.UnloadAdapterResponse.SerializeToString,
        ),
        "Tokenize": grpc.unary_unary_rpc_method_handler(
            servicer.Tokenize,
            request_deserializer=pb.TokenizeRequest.FromString,
            response_serializer=pb.TokenizeResponse.SerializeToString,
        ),
        "Embed": grpc.unary_unary_rpc_method_handler(
            servicer.Embed,
            request_deserializer=pb.EmbedRequest.FromString,
            response_serializer=pb.EmbedResponse.SerializeToString,
        ),
        "GetStats": grpc.unary_unary_rpc_method_handler(
            servicer.GetStats,
            request_deserializer=pb.GetStatsRequest.FromString,
            response_serializer=pb.WorkerStats.SerializeToString,
        ),
        "WatchLoad": grpc.unary_stream_rpc_method_handler(
            servicer.WatchLoad,
            request_deserializer=pb.WatchLoadRequest.FromString,
            response_serializer=pb.WorkerLoad.SerializeToString,
        ),
        "WatchCache": grpc.unary_stream_rpc_method_handler(
            servicer.WatchCache,
            request_deserializer=pb.WatchCacheRequest.FromString,
            response_serializer=pb.CacheEvents.SerializeToString,
        ),
    }


def add_to_server(servicer: GenerationServicer, server: grpc.aio.Server) -> None:
    """Register the servicer (in place of `pb_grpc.add_GenerationServicer_to_server`)."""
    handlers = method_handlers(servicer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
