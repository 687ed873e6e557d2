"""One generation: it runs in its own task, writes every message to its replay log, and
any number of consumers follow that log (the original stream, later `Resume` calls).

The log holds each message serialized, exactly once: the newest entry stays a message
while no consumer has taken it (tokens that are ready together merge into it), and is
serialized when a consumer takes it or when the next entry is appended. Consumers send
those bytes as they are, the first time and on every replay.

When the last consumer leaves before the end, the generation is detached: it keeps
running for its grace period so that a `Resume` can pick it up, then aborts.

A generation knows only what `Runtime` gives it (the engine, its owner's hooks, the
inter-token histogram): it imports neither the worker core nor the metrics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from generated import sluice_pb2 as pb
from model_service.engines.base import CallParser, Engine
from model_service.errors import DeadlineExceeded, EngineDead, EngineError, SluiceError
from model_service.generation import messages
from model_service.intake.admission import Ticket
from model_service.types import EngineOutput, FinishReason, GenerationRequest, ToolCallDelta

log = logging.getLogger("sluice.worker")

CLIENT_CANCEL = "client"
DETACH_EXPIRED = "detach-expired"
# Python's cost of one stored entry beyond its serialized bytes (bytes header + list slot).
ENTRY_OVERHEAD_BYTES = 41

Listener = Callable[["Generation"], None]
_MASK64 = (1 << 64) - 1


class Hooks(Protocol):
    """What a generation reports to its owner (the worker core)."""

    def finished(self, gen: Generation) -> None:
        """Called once, as the generation ends (any reason)."""

    def engine_died(self, err: SluiceError) -> None:
        """The engine failed for good (EngineDead)."""

    def detach_expired(self, wasted_tokens: int) -> None:
        """A detached generation was aborted after its grace."""


class Observer(Protocol):
    def observe(self, value: float) -> None: ...


class Ledger(Protocol):
    """Where the sizes of running generations' logs add up (the replay store, for its cap)."""

    live_bytes: int


@dataclass(frozen=True, slots=True)
class Runtime:
    """What all generations of one worker share."""

    engine: Engine
    hooks: Hooks
    itl: Observer  # inter-token gaps, seconds (lock-free: observed per token chunk)
    ledger: Ledger


class Generation:
    """One request on the engine and its replay log."""

    # Ended generations stay in the replay store for its retention: no __dict__ each.
    __slots__ = (
        "_cached_tokens", "_cancel_reason", "_choice_tokens", "_completion_tokens",
        "_detach_timer", "_ends", "_first_token_at", "_last_token_at", "_listeners", "_plain",
        "_prompt_tokens", "_reason", "_rt", "_scheduled_at", "_started", "_tail_text",
        "_timing", "_tokens_at_detach", "_waiters",
        "arrived", "detach_grace_s", "ended", "engine_id", "error", "log", "log_bytes",
        "loop", "parsers", "request", "request_id", "stamp", "subscribers", "task", "ticket",
        "timeout_s", "trace_id",
    )  # fmt: skip

    def __init__(
        self,
        rt: Runtime,
        request: GenerationRequest,
        *,
        engine_id: str,
        arrived: float,
        timeout_s: float | None,
        detach_grace_s: float,
    ) -> None:
        self._rt = rt
        self.request = request
        self.request_id = request.request_id
        self.engine_id = engine_id  # unique even when a caller reuses a finished id
        self.arrived = arrived
        self.timeout_s = timeout_s
        self.detach_grace_s = detach_grace_s
        self.stamp = False
        self.trace_id = ""
        self.task: asyncio.Task[None] | None = None
        # Serialized messages, except the newest while no consumer has taken it (it may
        # still grow): protobuf objects cost ~10x their wire size in memory.
        self.log: list[pb.GenerateResponse | bytes] = []
        self.log_bytes = 0  # of the serialized entries (what the replay cap counts)
        self.ended = False
        self.error: SluiceError | None = None  # set before the final message is logged
        self.subscribers = 0
        self.loop = asyncio.get_running_loop()  # once: each call is a getpid on Python 3.11
        self._waiters: list[asyncio.Future[None]] = []  # of consumers waiting for a change
        self._listeners: list[Listener] = []
        self._tail_text: list[str] = []  # text merged into the newest entry, not yet in it
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
        self._timing: tuple[int, int, int] | None = None  # taken once, at the final
        n = request.sampling.n
        self._choice_tokens = [0] * n  # completion tokens per choice
        self._ends: list[pb.ChoiceEnd | None] = [None] * n
        # Tool-call parsers, one per choice (set by the core when the request uses tools).
        self.parsers: list[CallParser | None] | None = None
        self.ticket: Ticket | None = None  # its place in the worker's admission
        self._plain = True  # chunks need only text and ids (set as the run starts)

    @property
    def index(self) -> int:
        """The index the next message will get (= messages so far)."""
        return len(self.log)

    # -- consumers ---------------------------------------------------------------------

    def attach(self, listener: Listener | None = None) -> None:
        """A consumer starts following (a detached generation is picked up again).
        `listener(gen)` is called on every change, for consumers of many generations."""
        self.subscribers += 1
        if listener is not None:
            self._listeners.append(listener)
        if self._detach_timer is not None:
            self._detach_timer.cancel()
            self._detach_timer = None

    def release(self, listener: Listener | None = None) -> None:
        """A consumer stops following; the last one leaving before the end detaches."""
        self.subscribers -= 1
        if listener is not None:
            self._listeners.remove(listener)
        if self.subscribers == 0 and not self.ended:
            self._detached()

    def take(self, i: int) -> bytes:
        """Entry `i` serialized; from now on nothing merges into it."""
        entry = self.log[i]
        if type(entry) is bytes:
            return entry
        return self._freeze(i)

    def changed(self) -> asyncio.Future[None]:
        """Resolved at the next change (a new entry or the end). One per waiting consumer:
        a consumer cancelled while it waits cancels its own future, nobody else's."""
        fut = self.loop.create_future()
        self._waiters.append(fut)
        return fut

    def _wake(self) -> None:
        if self._waiters:
            waiters, self._waiters = self._waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        for listener in self._listeners:
            listener(self)

    def _detached(self) -> None:
        if self.detach_grace_s <= 0:
            self.cancel(DETACH_EXPIRED)
            return
        self._tokens_at_detach = self._completion_tokens
        self._detach_timer = self.loop.call_later(self.detach_grace_s, self._detach_expired)

    def _detach_expired(self) -> None:
        self._detach_timer = None
        if self.subscribers == 0 and not self.ended:
            self._rt.hooks.detach_expired(self._completion_tokens - self._tokens_at_detach)
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
        """Detach a generation that no consumer ever attached to."""
        if (
            self.subscribers == 0
            and not self.ended
            and self._detach_timer is None
            and self._cancel_reason is None
        ):
            self._detached()

    # -- producing ---------------------------------------------------------------------

    def _freeze(self, i: int) -> bytes:
        if self._tail_text:  # only the newest entry is ever unfrozen, so this is it
            self.log[i].chunk.text += "".join(self._tail_text)  # type: ignore[union-attr]
            self._tail_text = []
        raw: bytes = self.log[i].SerializeToString()  # type: ignore[union-attr]
        self.log[i] = raw
        size = len(raw) + ENTRY_OVERHEAD_BYTES
        self.log_bytes += size
        self._rt.ledger.live_bytes += size
        return raw

    def _append(self, msg: pb.GenerateResponse) -> None:
        if self.stamp:
            msg.worker_time_ns = time.time_ns()
        log = self.log
        if log and type(log[-1]) is not bytes:
            self._freeze(len(log) - 1)  # nothing merges into it any more
        log.append(msg)
        self._wake()

    def _append_tokens(self, out: EngineOutput) -> None:
        """Add a token delta: merged into the last chunk while no consumer has taken it
        (tokens that are ready together travel in one message), else a new chunk.

        A merge wakes nobody: no consumer waits on an entry it has not taken yet."""
        log = self.log
        if log and not out.logprobs:
            tail = log[-1]
            if type(tail) is not bytes and tail.HasField("chunk"):  # type: ignore[union-attr]
                # Joined once, when the entry is frozen: `chunk.text += part` copies the
                # whole text each time, quadratic for a client that stopped reading.
                self._tail_text.append(out.text)
                tail.chunk.token_ids.extend(out.token_ids)  # type: ignore[union-attr]
                return
        self._append(messages.chunk_to_pb(self.request_id, len(log), out))

    def _append_choice(
        self,
        out: EngineOutput,
        choice: int,
        calls: list[ToolCallDelta] | None,
        end: pb.ChoiceEnd | None,
    ) -> None:
        """`_append_tokens` for the other shapes (n > 1, tool calls, usage in chunks):
        plain text still merges into the newest chunk of the same choice."""
        log = self.log
        if log and not out.logprobs and not calls and end is None:
            tail = log[-1]
            if type(tail) is not bytes and tail.HasField("chunk"):  # type: ignore[union-attr]
                chunk = tail.chunk  # type: ignore[union-attr]
                if chunk.choice == choice and not chunk.tool_calls:
                    self._tail_text.append(out.text)
                    chunk.token_ids.extend(out.token_ids)
                    if self.request.stream_usage:
                        chunk.usage.completion_tokens = self._completion_tokens
                    return
        msg = messages.chunk_to_pb(self.request_id, len(log), out, choice, calls)
        if end is not None:
            msg.chunk.choice_end.CopyFrom(end)
        if self.request.stream_usage:
            u = msg.chunk.usage
            u.prompt_tokens, u.completion_tokens = self._prompt_tokens, self._completion_tokens
            u.cached_prompt_tokens = self._cached_tokens
        self._append(msg)

    def summary(self) -> dict[str, Any]:
        """The generation's outcome, for metrics and the per-request log record."""
        queue_us, ttft_us, total_us = self._timing or self._timing_us()
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
        timing = self._timing = self._timing_us()
        choices = None
        if len(self._ends) > 1 and reason not in (FinishReason.ERROR, FinishReason.CANCELLED):
            choices = [end for end in self._ends if end is not None]
        msg = messages.final_to_pb(
            self.request_id,
            self.index,
            reason,
            usage,
            timing,
            stop_sequence=stop,
            error=error,
            choices=choices,
        )
        self._append(msg)
        self._freeze(len(self.log) - 1)  # a final never grows

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
                self._rt.hooks.engine_died(err)
        except asyncio.CancelledError:
            # Cancelled from outside the known reasons (worker stopping): record and end.
            self.error = EngineError("generation cancelled by the worker")
            self._final(FinishReason.ERROR, error=self.error)
        finally:
            if self.log and type(self.log[-1]) is not bytes:
                self._freeze(len(self.log) - 1)
            # The log is all that resumes need; drop the prompt (it can be large and the
            # replay cap does not count it).
            self.request.prompt = self.request.messages = self.request.prompt_token_ids = None
            self.ended = True
            self._wake()
            if self._detach_timer is not None:
                self._detach_timer.cancel()
            self._rt.hooks.finished(self)

    async def _drive(self) -> tuple[FinishReason, str]:
        """The engine loop: returns (finish reason, stop string) or raises SluiceError."""
        if self._cancel_reason is not None:  # cancelled before it started
            return self._cancelled()
        deadline = None
        if self.timeout_s is not None:  # one timer, and only for generations with a deadline
            deadline = self.loop.call_later(self.timeout_s, self._deadline_passed)
        n = self.request.sampling.n
        self._plain = n == 1 and not self.request.stream_usage and not self.parsers
        try:
            turn = self.ticket.turn if self.ticket is not None else None
            if turn is not None and not turn.done():  # queued until a batch slot is free
                try:
                    await asyncio.shield(turn)
                except asyncio.CancelledError:
                    if self._cancel_reason is None:
                        raise
                    return self._cancelled()
            if n == 1:  # the common case runs in this task: no child task, no fan-in
                return await self._choice(0, self.request, self.engine_id)
            return await self._choices(n)
        finally:
            if deadline is not None:
                deadline.cancel()

    async def _choices(self, n: int) -> tuple[FinishReason, str]:
        """n > 1: one engine request per choice, each in its own task, all writing to
        this log (choice i samples with seed + i); choice 0's ending is the generation's."""
        req, sp = self.request, self.request.sampling
        tasks = []
        for c in range(n):
            seed = None if sp.seed is None else (sp.seed + c) & _MASK64
            child = dataclasses.replace(req, sampling=dataclasses.replace(sp, n=1, seed=seed))
            engine_id = f"{self.engine_id}/{c}"
            tasks.append(self.loop.create_task(self._choice(c, child, engine_id)))
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if (exc := task.exception()) is not None:
                    raise exc
            return tasks[0].result()
        except asyncio.CancelledError:
            if self._cancel_reason is None:
                raise
            return self._cancelled()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _choice(
        self, c: int, request: GenerationRequest, engine_id: str
    ) -> tuple[FinishReason, str]:
        """Drive one engine request (choice `c`) to its end, logging its deltas."""
        itl = self._rt.itl
        request.request_id = engine_id
        parser = self.parsers[c] if self.parsers else None
        outputs = self._rt.engine.generate(request)
        finished = False
        try:
            async for out in outputs:
                if out.scheduled_at is not None:
                    self._scheduled_at = out.scheduled_at
                self._prompt_tokens = out.prompt_tokens or self._prompt_tokens
                self._cached_tokens = out.cached_prompt_tokens
                tokens = self._choice_tokens
                self._completion_tokens += out.completion_tokens - tokens[c]
                tokens[c] = out.completion_tokens
                calls = None
                if parser is not None:
                    out.text, calls = parser.feed(out.text, out.token_ids)
                    if out.finish_reason is not None:
                        rest, more = parser.end()
                        out.text += rest
                        calls += more
                end = None
                if out.finish_reason is not None:
                    finished = True
                    reason = out.finish_reason
                    if reason is FinishReason.STOP and parser is not None and parser.called:
                        reason = FinishReason.TOOL_CALLS
                    if len(tokens) > 1:
                        end = self._ends[c] = messages.choice_end_to_pb(
                            reason, out.stop_sequence, tokens[c]
                        )
                if out.text or out.token_ids or calls or end is not None:
                    now = time.monotonic()
                    if self._first_token_at is None:
                        self._first_token_at = now
                    else:
                        itl.observe(now - self._last_token_at)
                    self._last_token_at = now
                    if self._plain:
                        self._append_tokens(out)
                    else:
                        self._append_choice(out, c, calls, end)
                if finished:
                    return reason, out.stop_sequence
            # The engine ended the stream without a finish: aborted from outside.
            return self._cancelled()
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
            request.request_id = self.request_id
            if finished:
                await outputs.aclose()  # type: ignore[attr-defined]  # the engine ended it
            else:
                # Shielded: freeing the engine's slot and KV cache must complete.
                await asyncio.shield(self._abort_engine(outputs, engine_id))

    def _deadline_passed(self) -> None:
        self.cancel(DeadlineExceeded(f"generation exceeded its deadline of {self.timeout_s:.3f}s"))

    async def _abort_engine(self, outputs: AsyncIterator[EngineOutput], engine_id: str) -> None:
        await outputs.aclose()  # type: ignore[attr-defined]
        await self._rt.engine.abort(engine_id)

    def _cancelled(self) -> tuple[FinishReason, str]:
        reason = self._cancel_reason
        if isinstance(reason, SluiceError):
            raise reason
        if reason in (CLIENT_CANCEL, DETACH_EXPIRED):
            return FinishReason.CANCELLED, ""
        raise EngineError("engine ended the generation without a reason")
