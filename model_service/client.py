"""A small async client for internal services over the Generation stub; it imports only
grpc and `generated/` (never an engine), so any service can depend on it.

    async with SluiceClient("127.0.0.1:50051") as client:
        gen = client.generate(messages=[("user", "Hi")], max_tokens=32, timeout=10)
        async for chunk in gen:
            print(chunk.text, end="")

`client.generate` opens one `Generate` RPC per generation (simple mode). For many at once,
`async with client.session() as s: gen = s.generate(...)` carries them all on one `Session`
RPC (the same `Generation` interface: acceptance in-band, per-generation flow control).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import deque
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


class SessionGeneration:
    """One generation on a `ClientSession`: the `Generation` interface (async-iterate its
    chunks, then `final`; `text`, `cancel`), plus `detach` (stop following it)."""

    def __init__(self, session: ClientSession, request_id: str) -> None:
        self.request_id = request_id
        self.final: pb.Final | None = None
        self.last_index = -1
        self._session = session
        self._queue: deque[pb.GenerateResponse] = deque()
        self._changed = asyncio.Event()
        self._error: BaseException | None = None
        self._consumed = 0  # serialized bytes read, for the ack
        self._acked = 0

    def _put(self, msg: pb.GenerateResponse) -> None:
        self._queue.append(msg)
        self._changed.set()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._changed.set()

    def __aiter__(self) -> AsyncIterator[pb.TokenChunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[pb.TokenChunk]:
        try:
            while True:
                while not self._queue:
                    if self._error is not None:
                        raise self._error
                    self._changed.clear()
                    await self._changed.wait()
                msg = self._queue.popleft()
                self.last_index = msg.index
                self._consumed += msg.ByteSize()
                if self._consumed - self._acked >= self._session.window_bytes // 4:
                    self._acked = self._consumed
                    ack = pb.AckGeneration(request_id=self.request_id, bytes=self._acked)
                    self._session.send(pb.SessionAction(ack=ack))
                if msg.HasField("final"):
                    self.final = msg.final
                    if msg.final.HasField("error"):
                        e = msg.final.error
                        code = _STATUS.get(e.code, grpc.StatusCode.UNKNOWN)
                        raise GenerationError(code, e.message, e.retry_after_ms / 1000)
                    return
                yield msg.chunk
        finally:
            self._session.forget(self)

    async def text(self) -> str:
        """Consume the generation and return its whole text."""
        return "".join([c.text async for c in self])

    def cancel(self) -> None:
        """Ask the worker to stop; the generation then ends with reason CANCELLED."""
        self._session.send(pb.SessionAction(cancel=pb.CancelGeneration(request_id=self.request_id)))

    def detach(self) -> None:
        """Stop following it (it runs on and may be resumed by its id)."""
        self._session.send(pb.SessionAction(detach=pb.DetachGeneration(request_id=self.request_id)))
        self._session.forget(self)
        self._fail(GenerationError(grpc.StatusCode.CANCELLED, "detached"))


_STATUS = {c.value[0]: c for c in grpc.StatusCode}


class ClientSession:
    """One `Session` RPC carrying any number of generations (see the module docstring).
    A broken session fails its open generations with the RPC's status."""

    def __init__(self, stub: pb_grpc.GenerationStub, window_bytes: int) -> None:
        self.window_bytes = window_bytes or 256 * 1024
        self._gens: dict[str, SessionGeneration] = {}
        self._outbox: asyncio.Queue[pb.SessionAction | None] = asyncio.Queue()
        self.send(pb.SessionAction(options=pb.SessionOptions(window_bytes=window_bytes)))
        self._call = stub.Session(self._requests())
        self._reader = asyncio.get_running_loop().create_task(self._read())

    def send(self, action: pb.SessionAction) -> None:
        self._outbox.put_nowait(action)

    def forget(self, gen: SessionGeneration) -> None:
        if self._gens.get(gen.request_id) is gen:
            del self._gens[gen.request_id]

    async def _requests(self) -> AsyncIterator[pb.SessionRequest]:
        while (action := await self._outbox.get()) is not None:
            actions = [action]
            while not self._outbox.empty():  # every action queued meanwhile, one message
                more = self._outbox.get_nowait()
                if more is None:
                    yield pb.SessionRequest(actions=actions)
                    return
                actions.append(more)
            yield pb.SessionRequest(actions=actions)

    async def _read(self) -> None:
        error: BaseException = GenerationError(grpc.StatusCode.UNAVAILABLE, "session ended")
        try:
            async for frame in self._call:
                for msg in frame.entries:
                    gen = self._gens.get(msg.request_id)
                    if gen is not None:
                        gen._put(msg)
        except grpc.aio.AioRpcError as err:
            error = GenerationError.from_rpc(err)
        except asyncio.CancelledError:
            error = GenerationError(grpc.StatusCode.CANCELLED, "session closed")
        for gen in list(self._gens.values()):
            gen._fail(error)
        self._gens.clear()

    def generate(self, *, timeout: float | None = None, **kwargs: Any) -> SessionGeneration:
        """Start a generation on this session; see `build_start` for the arguments."""
        return self.start(build_start(timeout=timeout, **kwargs))

    def start(self, start: pb.StartGeneration) -> SessionGeneration:
        """Start a generation from a contract message as it is."""
        if start.request_id in self._gens:
            raise ValueError(f"request id {start.request_id!r} is open on this session")
        gen = SessionGeneration(self, start.request_id)
        self._gens[start.request_id] = gen
        self.send(pb.SessionAction(start=start))
        return gen

    async def close(self) -> None:
        """End the session: the worker ends its generations after a short grace."""
        self._outbox.put_nowait(None)
        self._call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader

    async def __aenter__(self) -> ClientSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


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

    def session(self, window_bytes: int = 0) -> ClientSession:
        """A `Session` RPC for many generations (`window_bytes`: each one's flow-control
        window; 0: the worker's default). Use as `async with client.session() as s`."""
        return ClientSession(self.stub, window_bytes)

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
