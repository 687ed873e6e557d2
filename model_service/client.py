"""A small async client for internal services over the Generation stub; it imports only
grpc and `generated/` (never an engine), so any service can depend on it.

    async with SluiceClient("127.0.0.1:50051") as client:
        gen = client.generate(messages=[("user", "Hi")], max_tokens=32, timeout=10)
        async for chunk in gen:
            print(chunk.text, end="")
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from sluice_common.contract import RETRY_AFTER_KEY

CHANNEL_OPTIONS = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 8 * 1024 * 1024),
)


class GenerationError(Exception):
    """A generation failed: gRPC status code, message and the worker's retry hint."""

    def __init__(self, code: grpc.StatusCode, message: str, retry_after_s: float = 0.0) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s

    @classmethod
    def from_rpc(cls, err: grpc.aio.AioRpcError) -> GenerationError:
        retry = 0.0
        for key, value in err.trailing_metadata() or ():
            if key == RETRY_AFTER_KEY:
                retry = int(value) / 1000
        return cls(err.code(), err.details() or "", retry)


def build_start(
    *,
    prompt: str | None = None,
    messages: Iterable[tuple[str, str]] | None = None,
    request_id: str | None = None,
    model: str = "",
    timeout: float | None = None,
    structured_output: pb.StructuredOutput | None = None,
    tools: Iterable[pb.Tool] = (),
    tool_choice: pb.ToolChoice | None = None,
    **sampling: Any,
) -> pb.StartGeneration:
    """A StartGeneration from keyword arguments (sampling fields by their proto names;
    `structured_output`, `tools` and `tool_choice` as contract messages)."""
    start = pb.StartGeneration(
        request_id=request_id or uuid.uuid4().hex,
        model=model,
        sampling=pb.SamplingParams(**sampling),
        timeout_ms=int(timeout * 1000) if timeout else 0,
        structured_output=structured_output,
    )
    if messages is not None:
        start.chat.messages.extend(pb.ChatMessage(role=r, content=c) for r, c in messages)
        start.chat.tools.extend(tools)
        if tool_choice is not None:
            start.chat.tool_choice.CopyFrom(tool_choice)
    elif prompt is not None:
        start.prompt = prompt
    return start


class Generation:
    """One generation: async-iterate its token chunks; then `final` holds the end."""

    def __init__(
        self, stub: pb_grpc.GenerationStub, start: pb.StartGeneration, timeout: float | None
    ) -> None:
        self.request_id = start.request_id
        self.final: pb.Final | None = None
        self.last_index = -1
        self._outbox: asyncio.Queue[pb.GenerateRequest | None] = asyncio.Queue()
        self._outbox.put_nowait(pb.GenerateRequest(start=start))
        self._call = stub.Generate(self._requests(), timeout=timeout)

    async def _requests(self) -> AsyncIterator[pb.GenerateRequest]:
        while (msg := await self._outbox.get()) is not None:
            yield msg

    def __aiter__(self) -> AsyncIterator[pb.TokenChunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[pb.TokenChunk]:
        try:
            async for msg in self._call:
                self.last_index = msg.index
                if msg.HasField("final"):
                    self.final = msg.final
                    break
                yield msg.chunk
        except grpc.aio.AioRpcError as err:
            raise GenerationError.from_rpc(err) from None
        finally:
            self._outbox.put_nowait(None)

    async def text(self) -> str:
        """Consume the generation and return its whole text."""
        return "".join([c.text async for c in self])

    def cancel(self) -> None:
        """Ask the worker to stop; the generation then ends with reason CANCELLED."""
        self._outbox.put_nowait(
            pb.GenerateRequest(cancel=pb.CancelGeneration(request_id=self.request_id))
        )

    def abort(self) -> None:
        """Drop the RPC at once (the worker aborts the engine request)."""
        self._call.cancel()


class SluiceClient:
    """One shared channel to a worker; any number of concurrent generations over it."""

    def __init__(self, target: str, *, channel: grpc.aio.Channel | None = None) -> None:
        self._own = channel is None
        self.channel = channel or grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        self.stub = pb_grpc.GenerationStub(self.channel)

    async def __aenter__(self) -> SluiceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own:
            await self.channel.close()

    def generate(self, *, timeout: float | None = None, **kwargs: Any) -> Generation:
        """Start a generation; see `build_start` for the arguments."""
        return Generation(self.stub, build_start(timeout=timeout, **kwargs), timeout)

    async def _unary(self, method: Any, request: Any, timeout: float | None) -> Any:
        try:
            return await method(request, timeout=timeout)
        except grpc.aio.AioRpcError as err:
            raise GenerationError.from_rpc(err) from None

    async def list_models(self, timeout: float | None = 10) -> list[pb.ModelInfo]:
        resp = await self._unary(self.stub.ListModels, pb.ListModelsRequest(), timeout)
        return list(resp.models)

    async def tokenize(
        self,
        *,
        prompt: str | None = None,
        messages: Iterable[tuple[str, str]] | None = None,
        timeout: float | None = 10,
    ) -> list[int]:
        req = pb.TokenizeRequest()
        if messages is not None:
            req.chat.messages.extend(pb.ChatMessage(role=r, content=c) for r, c in messages)
        else:
            req.prompt = prompt or ""
        resp = await self._unary(self.stub.Tokenize, req, timeout)
        return list(resp.token_ids)

    async def stats(self, timeout: float | None = 10) -> pb.WorkerStats:
        return await self._unary(self.stub.GetStats, pb.GetStatsRequest(), timeout)

    async def watch_load(
        self, min_interval_s: float = 0.0, max_interval_s: float = 0.0
    ) -> AsyncIterator[pb.WorkerLoad]:
        """The worker's load as it pushes it (`WatchLoad`), until the caller stops."""
        req = pb.WatchLoadRequest(
            min_interval_ms=int(min_interval_s * 1000), max_interval_ms=int(max_interval_s * 1000)
        )
        call = self.stub.WatchLoad(req)
        try:
            async for msg in call:
                yield msg
        except grpc.aio.AioRpcError as err:
            raise GenerationError.from_rpc(err) from None
        finally:
            call.cancel()
