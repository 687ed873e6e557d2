"""One generation's life: admission, the engine loop, indices, usage, timing, cancellation.

`WorkerCore` holds what all streams share (engine, admission, limits, the live set, the
draining flag); `Generation` runs one request and emits protobuf messages through a
callback. The gRPC stream plumbing lives in `stream.py`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from generated import sluice_pb2 as pb
from model_service import convert
from model_service.admission import Admission
from model_service.config import WorkerConfig
from model_service.engines.base import Engine
from model_service.errors import (
    DeadlineExceeded,
    EngineError,
    SluiceError,
    Unavailable,
)
from model_service.types import FinishReason, GenerationRequest
from model_service.validation import resolve_max_tokens, validate_request

log = logging.getLogger("sluice.worker")

Send = Callable[[pb.GenerateResponse], Awaitable[None]]
CLIENT_CANCEL = "client"


class WorkerCore:
    """Shared state of one worker process."""

    def __init__(self, engine: Engine, config: WorkerConfig) -> None:
        self.engine = engine
        self.config = config
        self.admission = Admission(config.admission)
        self.ready = False
        self.draining = False
        self.live: set[Generation] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._ids = itertools.count()

    async def prepare(self, start: pb.StartGeneration, deadline_s: float | None) -> Generation:
        """Decode, validate, admit and tokenize a start message. Raises SluiceError."""
        arrived = time.monotonic()
        req = convert.request_from_pb(start)
        if not self.ready or self.draining:
            raise Unavailable("worker is draining" if self.draining else "engine is not ready yet")
        model = self.engine.model_info
        validate_request(req, model, self.config.limits)
        self.admission.admit(self.engine.stats())
        try:
            ids = await self.engine.tokenize(req)
            req.prompt_token_ids = ids
            max_tokens = resolve_max_tokens(req, model, len(ids))
            if req.sampling.max_tokens != max_tokens:
                req.sampling = replace(req.sampling, max_tokens=max_tokens)
        except BaseException:
            self.admission.release()
            raise
        timeout = req.timeout_s
        if deadline_s is not None:
            timeout = deadline_s if timeout is None else min(timeout, deadline_s)
        gen = Generation(self, req, f"{req.request_id}#{next(self._ids)}", arrived, timeout)
        gen.stamp = start.stamp_times
        self.live.add(gen)
        self._idle.clear()
        return gen

    def finished(self, gen: Generation) -> None:
        if gen in self.live:
            self.live.discard(gen)
            self.admission.release()
            if not self.live:
                self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no generation is live; False if `timeout` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False

    def abort_all(self, reason: SluiceError) -> None:
        for gen in list(self.live):
            gen.cancel(reason)


class Generation:
    """One request on the engine; `run()` emits its chunks and final message via `send`."""

    def __init__(
        self,
        core: WorkerCore,
        request: GenerationRequest,
        engine_id: str,
        arrived: float,
        timeout_s: float | None,
    ) -> None:
        self.core = core
        self.request = request
        self.request_id = request.request_id
        self.engine_id = engine_id
        self.arrived = arrived
        self.timeout_s = timeout_s
        self.stamp = False
        self.index = 0
        self.task: asyncio.Task[None] | None = None
        self._cancel_reason: str | SluiceError | None = None
        self._prompt_tokens = len(request.prompt_token_ids or ())
        self._completion_tokens = 0
        self._cached_tokens = 0
        self._scheduled_at: float | None = None
        self._first_token_at: float | None = None

    def cancel(self, reason: str | SluiceError) -> None:
        """End the generation: CLIENT_CANCEL -> final CANCELLED; an error -> that error."""
        if self._cancel_reason is None:
            self._cancel_reason = reason
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def _message(self, msg: pb.GenerateResponse) -> pb.GenerateResponse:
        self.index += 1
        if self.stamp:
            msg.worker_time_ns = time.time_ns()
        return msg

    def timing_us(self) -> tuple[int, int, int]:
        now = time.monotonic()
        first = self._first_token_at or now
        sched = self._scheduled_at or first
        return (
            int((sched - self.arrived) * 1e6),
            int((first - self.arrived) * 1e6),
            int((now - self.arrived) * 1e6),
        )

    def final(
        self, reason: FinishReason, *, stop: str = "", error: SluiceError | None = None
    ) -> pb.GenerateResponse:
        usage = (self._prompt_tokens, self._completion_tokens, self._cached_tokens)
        msg = convert.final_to_pb(
            self.request_id,
            self.index,
            reason,
            usage,
            self.timing_us(),
            stop_sequence=stop,
            error=error,
        )
        return self._message(msg)

    async def run(self, send: Send) -> None:
        """Drive the engine to the end. Raises SluiceError on failure (after aborting)."""
        engine = self.core.engine
        self.request.request_id = self.engine_id
        outputs = engine.generate(self.request)
        done = False
        try:
            async with asyncio.timeout(self.timeout_s):
                async for out in outputs:
                    if out.scheduled_at is not None:
                        self._scheduled_at = out.scheduled_at
                    self._completion_tokens = out.completion_tokens
                    self._prompt_tokens = out.prompt_tokens or self._prompt_tokens
                    self._cached_tokens = out.cached_prompt_tokens
                    if out.text or out.token_ids:
                        if self._first_token_at is None:
                            self._first_token_at = time.monotonic()
                        await send(
                            self._message(convert.chunk_to_pb(self.request_id, self.index, out))
                        )
                    if out.finish_reason is not None:
                        done = True
                        await send(self.final(out.finish_reason, stop=out.stop_sequence))
                        return
            # The engine ended the stream without a finish: it was aborted from outside.
            if self._cancel_reason == CLIENT_CANCEL:
                done = True
                await send(self.final(FinishReason.CANCELLED))
                return
            raise self._cancel_error() or EngineError(
                "engine ended the generation without a reason"
            )
        except TimeoutError:
            raise DeadlineExceeded(
                f"generation exceeded its deadline of {self.timeout_s:.3f}s"
            ) from None
        except asyncio.CancelledError:
            if self._cancel_reason == CLIENT_CANCEL:
                done = True
                await send(self.final(FinishReason.CANCELLED))
                return
            if isinstance(self._cancel_reason, SluiceError):
                raise self._cancel_reason from None
            raise
        except SluiceError:
            raise
        except Exception as exc:
            log.exception("engine failure in %s", self.engine_id)
            raise EngineError(f"engine failure: {type(exc).__name__}") from exc
        finally:
            self.request.request_id = self.request_id
            await outputs.aclose()  # type: ignore[attr-defined]
            if not done:
                await engine.abort(self.engine_id)
            self.core.finished(self)

    def _cancel_error(self) -> SluiceError | None:
        if isinstance(self._cancel_reason, SluiceError):
            return self._cancel_reason
        return None
