"""One generation: it runs in its own task, writes every message to its replay log, and
any number of consumers follow that log (the original stream, later `Resume` calls).

When the last consumer leaves before the end, the generation is detached: it keeps
running for its grace period so that a `Resume` can pick it up, then aborts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from generated import sluice_pb2 as pb
from model_service import convert
from model_service.errors import DeadlineExceeded, EngineDead, EngineError, SluiceError
from model_service.types import EngineOutput, FinishReason, GenerationRequest

if TYPE_CHECKING:
    from model_service.core import WorkerCore

log = logging.getLogger("sluice.worker")

CLIENT_CANCEL = "client"
DETACH_EXPIRED = "detach-expired"
# Python's cost of one stored entry beyond its serialized bytes (bytes header + list slot).
ENTRY_OVERHEAD_BYTES = 41


class Generation:
    """One request on the engine and its replay log."""

    def __init__(
        self,
        core: WorkerCore,
        request: GenerationRequest,
        arrived: float,
        timeout_s: float | None,
        detach_grace_s: float,
    ) -> None:
        self.core = core
        self.request = request
        self.request_id = request.request_id
        self.arrived = arrived
        self.timeout_s = timeout_s
        self.detach_grace_s = detach_grace_s
        self.stamp = False
        self.trace_id = ""
        self.task: asyncio.Task[None] | None = None
        # Serialized messages, except the newest, which stays a message while tokens may
        # still merge into it: protobuf objects cost ~10x their wire size in memory.
        self.log: list[pb.GenerateResponse | bytes] = []
        self.log_bytes = 0  # of the serialized entries (what the replay cap counts)
        self.ended = False
        self.error: SluiceError | None = None
        self.subscribers = 0
        self._changed = asyncio.Event()
        self._waited = False
        self._taken = -1  # highest log index any consumer has taken (immutable from then)
        # Text merged into the untaken tail chunk, joined once when it is taken or frozen:
        # `chunk.text += part` copies the whole string each time (quadratic for a client
        # that stops reading while the engine runs on).
        self._tail_text: list[str] = []
        self._detach_timer: asyncio.TimerHandle | None = None
        self._tokens_at_detach = 0
        self._cancel_reason: str | SluiceError | None = None
        self._started = False
        self._prompt_tokens = len(request.prompt_token_ids or ())
        self._completion_tokens = 0
        self._cached_tokens = 0
        self._scheduled_at: float | None = None
        self._first_token_at: float | None = None
        self._last_token_at = 0.0
        self._reason = FinishReason.ERROR

    @property
    def index(self) -> int:
        """The index the next message will get (= messages so far)."""
        return len(self.log)

    # -- consumers ---------------------------------------------------------------------

    async def follow(self, from_index: int = 0) -> AsyncGenerator[pb.GenerateResponse, None]:
        """Messages from `from_index` on, live until the final one. Use with `aclosing`."""
        self.subscribers += 1
        if self._detach_timer is not None:
            self._detach_timer.cancel()
            self._detach_timer = None
        i = from_index
        log = self.log
        try:
            while True:
                changed = self._changed
                while i < len(log):
                    if i > self._taken:
                        self._taken = i  # from now on this message is immutable
                        if self._tail_text and i == len(log) - 1:
                            self._settle_tail()
                    entry = log[i]
                    if isinstance(entry, bytes):
                        entry = pb.GenerateResponse.FromString(entry)  # a replay
                    yield entry
                    i += 1
                if self.ended:
                    return
                self._waited = True
                await changed.wait()
        finally:
            self.subscribers -= 1
            if self.subscribers == 0 and not self.ended:
                self._detached()

    def _detached(self) -> None:
        if self.detach_grace_s <= 0:
            self.cancel(DETACH_EXPIRED)
            return
        self._tokens_at_detach = self._completion_tokens
        loop = asyncio.get_running_loop()
        self._detach_timer = loop.call_later(self.detach_grace_s, self._detach_expired)

    def _detach_expired(self) -> None:
        self._detach_timer = None
        if self.subscribers == 0 and not self.ended:
            self.core.detach_expired_total += 1
            self.core.wasted_tokens_total += self._completion_tokens - self._tokens_at_detach
            self.cancel(DETACH_EXPIRED)

    def cancel(self, reason: str | SluiceError) -> None:
        """End early: CLIENT_CANCEL or DETACH_EXPIRED -> final CANCELLED; an error -> it.

        Only the first cancel counts: a second one must not interrupt the clean-up (the
        engine abort) that the first one started.
        """
        if self._cancel_reason is not None or self.ended:
            return
        self._cancel_reason = reason
        # A task that has not started yet sees the reason when it does (cancelling it now
        # would skip `run()` entirely: no final message, no clean-up).
        if self._started and self.task is not None and not self.task.done():
            self.task.cancel()

    def detach_if_unfollowed(self) -> None:
        """Detach a generation that no consumer ever followed (see `stream.py`)."""
        if (
            self.subscribers == 0
            and not self.ended
            and self._detach_timer is None
            and self._cancel_reason is None
        ):
            self._detached()

    # -- producing ---------------------------------------------------------------------

    def _settle_tail(self) -> None:
        tail = self.log[-1]
        assert isinstance(tail, pb.GenerateResponse)
        tail.chunk.text += "".join(self._tail_text)
        self._tail_text = []

    def _freeze_tail(self) -> None:
        """Store the newest entry serialized: nothing will merge into it any more."""
        if self._tail_text:
            self._settle_tail()
        if self.log and not isinstance(tail := self.log[-1], bytes):
            raw = tail.SerializeToString()
            self.log[-1] = raw
            self.log_bytes += len(raw) + ENTRY_OVERHEAD_BYTES

    def _append(self, msg: pb.GenerateResponse) -> None:
        if self.stamp:
            msg.worker_time_ns = time.time_ns()
        self._freeze_tail()
        self.log.append(msg)
        self._wake()

    def _append_tokens(self, out: EngineOutput) -> None:
        """Add a token delta: merged into the last chunk while no consumer has taken it
        (tokens that are ready together travel in one message), else a new chunk."""
        last = len(self.log) - 1
        tail = self.log[-1] if self.log else None
        if (
            last > self._taken
            and isinstance(tail, pb.GenerateResponse)
            and tail.HasField("chunk")
            and not out.logprobs
        ):
            self._tail_text.append(out.text)
            tail.chunk.token_ids.extend(out.token_ids)
            return
        self._append(convert.chunk_to_pb(self.request_id, len(self.log), out))

    def _wake(self) -> None:
        if self._waited:  # only pay for a new Event when a consumer waits on this one
            self._waited = False
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()

    def summary(self) -> dict[str, Any]:
        """The generation's outcome, for metrics and the per-request log record."""
        queue_us, ttft_us, total_us = self._timing_us()
        if self.error is not None:
            code = self.error.code.name
        else:
            code = "CANCELLED" if self._reason is FinishReason.CANCELLED else "OK"
        return {
            "request_id": self.request_id,
            "trace_id": self.trace_id,
            "code": code,
            "reason": self._reason.value,
            "prompt_tokens": self._prompt_tokens,
            "completion_tokens": self._completion_tokens,
            "cached_prompt_tokens": self._cached_tokens,
            "queue_s": queue_us / 1e6,
            "ttft_s": ttft_us / 1e6,
            "total_s": total_us / 1e6,
        }

    def _timing_us(self) -> tuple[int, int, int]:
        now = time.monotonic()
        first = self._first_token_at or now
        sched = self._scheduled_at or first
        return (
            int((sched - self.arrived) * 1e6),
            int((first - self.arrived) * 1e6),
            int((now - self.arrived) * 1e6),
        )

    def _final(
        self, reason: FinishReason, *, stop: str = "", error: SluiceError | None = None
    ) -> None:
        self._reason = reason
        usage = (self._prompt_tokens, self._completion_tokens, self._cached_tokens)
        self._append(
            convert.final_to_pb(
                self.request_id,
                self.index,
                reason,
                usage,
                self._timing_us(),
                stop_sequence=stop,
                error=error,
            )
        )

    async def run(self) -> None:
        """Drive the engine to the end; every outcome ends the log with a final message."""
        self._started = True
        try:
            reason, stop = await self._drive()
            self._final(reason, stop=stop)
        except SluiceError as err:
            self.error = err
            self._final(FinishReason.ERROR, error=err)
            if isinstance(err, EngineDead):
                self.core.engine_died(err)
        except asyncio.CancelledError:
            # Cancelled from outside the known reasons (worker stopping): record and end.
            self.error = EngineError("generation cancelled by the worker")
            self._final(FinishReason.ERROR, error=self.error)
        finally:
            self._freeze_tail()
            # The log is all that resumes need; drop the prompt (it can be large and the
            # replay cap does not count it).
            self.request.prompt = self.request.messages = self.request.prompt_token_ids = None
            self.ended = True
            self._changed.set()
            if self._detach_timer is not None:
                self._detach_timer.cancel()
            self.core.finished(self)

    async def _drive(self) -> tuple[FinishReason, str]:
        """The engine loop: returns (finish reason, stop string) or raises SluiceError."""
        if self._cancel_reason is not None:  # cancelled before it started
            return self._cancelled()
        engine = self.core.engine
        engine_id = self.core.engine_id(self.request_id)
        itl = self.core.metrics.itl
        self.request.request_id = engine_id
        outputs = engine.generate(self.request)
        finished = False
        try:
            async with asyncio.timeout(self.timeout_s):
                async for out in outputs:
                    if out.scheduled_at is not None:
                        self._scheduled_at = out.scheduled_at
                    self._completion_tokens = out.completion_tokens
                    self._prompt_tokens = out.prompt_tokens or self._prompt_tokens
                    self._cached_tokens = out.cached_prompt_tokens
                    if out.text or out.token_ids:
                        now = time.monotonic()
                        if self._first_token_at is None:
                            self._first_token_at = now
                        else:
                            itl.observe(now - self._last_token_at)
                        self._last_token_at = now
                        self._append_tokens(out)
                    if out.finish_reason is not None:
                        finished = True
                        return out.finish_reason, out.stop_sequence
            # The engine ended the stream without a finish: aborted from outside.
            return self._cancelled()
        except TimeoutError:
            raise DeadlineExceeded(
                f"generation exceeded its deadline of {self.timeout_s:.3f}s"
            ) from None
        except asyncio.CancelledError:
            if self._cancel_reason is None:
                raise
            return self._cancelled()
        except SluiceError:
            raise
        except Exception as exc:
            log.exception("engine failure in %s", engine_id)
            raise EngineError(f"engine failure: {type(exc).__name__}") from exc
        finally:
            self.request.request_id = self.request_id
            # Shielded: freeing the engine's slot and KV cache must complete.
            await asyncio.shield(self._release_engine(outputs, engine_id, finished))

    async def _release_engine(self, outputs: Any, engine_id: str, finished: bool) -> None:
        await outputs.aclose()
        if not finished:
            await self.core.engine.abort(engine_id)

    def _cancelled(self) -> tuple[FinishReason, str]:
        reason = self._cancel_reason
        if isinstance(reason, SluiceError):
            raise reason
        if reason in (CLIENT_CANCEL, DETACH_EXPIRED):
            return FinishReason.CANCELLED, ""
        raise EngineError("engine ended the generation without a reason")
