"""One generation in its own task: the engine loop, its replay log, the consumers that
follow the log, detaching when the last one leaves before the end, and its outcome."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

from generated import sluice_pb2 as pb
from model_service.engines.base import CallParser, Reasoner
from model_service.errors import DeadlineExceeded, EngineDead, EngineError, SluiceError
from model_service.generation import messages
from model_service.generation.log import ReplayLog
from model_service.generation.runtime import Runtime
from model_service.intake import tools
from model_service.intake.admission import Ticket
from model_service.types import (
    EngineOutput,
    FinishReason,
    GenerationRequest,
    TokenLogprob,
    ToolCallDelta,
)

log = logging.getLogger("sluice.worker")

CLIENT_CANCEL = "client"
DETACH_EXPIRED = "detach-expired"

Listener = Callable[["Generation"], None]


class Generation:
    """One request on the engine and its replay log."""

    # Ended generations stay in the replay store for its retention: no __dict__ each.
    __slots__ = (
        "_cached_tokens", "_cancel_reason", "_choice_tokens", "_completion_tokens",
        "_detach_timer", "_ends", "_first_token_at", "_last_token_at", "_listeners", "_plain",
        "_prompt_due", "_prompt_tokens", "_rt", "_scheduled_at", "_started", "_timing",
        "_tokens_at_detach", "_waiters",
        "arrived", "detach_grace_s", "ended", "engine_id", "error", "log", "loop", "parsers",
        "reason", "reasoners", "request", "request_id", "stamp", "subscribers", "task", "ticket",
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
        self.log = ReplayLog(rt.ledger)
        self.ended = False
        self.error: SluiceError | None = None  # set before the final message is logged
        self.subscribers = 0
        self.loop = asyncio.get_running_loop()  # once: each call is a getpid on Python 3.11
        self._waiters: list[asyncio.Future[None]] = []  # of consumers waiting for a change
        self._listeners: list[Listener] = []
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
        self.reason = FinishReason.ERROR  # how it ended (ERROR until its final is logged)
        self._timing: tuple[int, int, int] | None = None  # taken once, at the final
        n = request.sampling.n
        self._choice_tokens = [0] * n  # completion tokens per choice
        self._ends: list[pb.ChoiceEnd | None] = [None] * n
        # Tool-call parsers, one per choice (set by the core when the request uses tools).
        self.parsers: list[CallParser | None] | None = None
        # Reasoning parsers, one per choice (set by the core with --reasoning-parser).
        self.reasoners: list[Reasoner | None] | None = None
        self.ticket: Ticket | None = None  # its place in the worker's admission
        self._plain = True  # chunks need only text and ids (set as the run starts)
        # The prompt's message waits for the engine's first output (its logprobs).
        self._prompt_due = request.sampling.prompt_logprobs is not None

    @property
    def index(self) -> int:
        """The index the next message will get (= messages so far)."""
        return len(self.log)

    @property
    def usage(self) -> tuple[int, int, int]:
        """Tokens so far: prompt, completion (all choices), cached prompt."""
        return self._prompt_tokens, self._completion_tokens, self._cached_tokens

    @property
    def timing_us(self) -> tuple[int, int, int]:
        """Arrival to scheduling, to the first token, to the end (or now), microseconds."""
        return self._timing or self._timing_us()

    @property
    def log_bytes(self) -> int:
        """The log's serialized size (what the replay cap counts)."""
        return self.log.bytes

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
        return self.log.take(i)

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
        Only the first counts: a second must not interrupt the engine abort it started."""
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

    def _append(self, msg: pb.GenerateResponse) -> None:
        if self.stamp:
            msg.worker_time_ns = time.time_ns()
        self.log.add(msg)
        self._wake()

    def _append_prompt(self, logprobs: list[TokenLogprob] | None) -> None:
        """The prompt's message (its ids, its logprobs, its text, with `stream_usage` its
        count: as asked), serialized at once so that no token merges into it."""
        req = self.request
        ids = req.prompt_token_ids if req.return_prompt_tokens else None
        msg = messages.prompt_to_pb(self.request_id, len(self.log), ids, logprobs)
        msg.chunk.prompt_text = req.prompt_text or ""
        if req.stream_usage:  # vLLM's opening chunk: the prompt's count, no completion
            messages.with_end_and_usage(msg, None, (self._prompt_tokens, 0, self._cached_tokens))
        self._append(msg)
        self.log.take(len(self.log) - 1)

    def _append_tokens(self, out: EngineOutput) -> None:
        """A token delta, merged into the newest chunk while nobody has taken it, else a
        new chunk. A merge wakes nobody: no consumer waits on an entry it has not taken."""
        if out.logprobs or not self.log.merge(out.text, out.token_ids):
            self._append(messages.chunk_to_pb(self.request_id, len(self.log), out))

    def _append_choice(
        self,
        out: EngineOutput,
        choice: int,
        calls: list[ToolCallDelta] | None,
        end: pb.ChoiceEnd | None,
    ) -> None:
        """`_append_tokens` for the other shapes (n > 1, tool calls, usage in chunks,
        thinking): plain text or thinking still merges into the newest chunk of the same
        choice (thinking only while that holds no text: a chunk's thinking comes first)."""
        usage = self.request.stream_usage
        if not out.logprobs and not calls and end is None:
            if not out.reasoning:
                chunk = self.log.merge_choice(out.text, out.token_ids, choice)
            elif not out.text:  # thinking alone; thinking after text starts a new chunk
                chunk = self.log.merge_reasoning(out.reasoning, out.token_ids, choice)
            else:
                chunk = None
            if chunk is not None:
                if usage:
                    chunk.usage.completion_tokens = self._completion_tokens
                return
        msg = messages.chunk_to_pb(self.request_id, len(self.log), out, choice, calls)
        self._append(messages.with_end_and_usage(msg, end, self.usage if usage else None))

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
        self.reason = reason
        usage, timing = self.usage, self._timing_us()
        self._timing = timing
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
        self.log.close()

    async def run(self) -> None:
        """Drive the engine to the end; every outcome ends the log with a final message."""
        self._started = True
        try:
            req = self.request
            asked = req.return_prompt_tokens or req.prompt_text is not None or req.stream_usage
            if asked and not self._prompt_due:
                self._append_prompt(None)
            reason, stop = await self._drive()
            self._final(reason, stop=stop)
        except SluiceError as err:
            self.error = err
            self._final(FinishReason.ERROR, error=err)
            if isinstance(err, EngineDead):
                self._rt.hooks.engine_died(err)
        except Exception:  # a worker bug: the stream still ends, with an INTERNAL final
            log.exception("generation %r failed in the worker", self.request_id)
            self.error = EngineError("the worker failed the generation")
            bare = (0, 0, 0)  # what failed may be the figures themselves
            final = messages.final_to_pb(
                self.request_id, self.index, FinishReason.ERROR, bare, bare, error=self.error
            )
            self._append(final)
        except asyncio.CancelledError:
            # Cancelled from outside the known reasons (worker stopping): record and end.
            self.error = EngineError("generation cancelled by the worker")
            self._final(FinishReason.ERROR, error=self.error)
        finally:
            self.log.close()
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
        self._plain = (
            n == 1 and not self.request.stream_usage and not self.parsers and not self.reasoners
        )
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
        tasks = [
            self.loop.create_task(self._choice(c, self.request.choice(c), f"{self.engine_id}/{c}"))
            for c in range(n)
        ]
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
        reasoner = self.reasoners[c] if self.reasoners else None
        outputs = self._rt.engine.generate(request)
        finished = False
        try:
            async for out in outputs:
                if self._prompt_due and c == 0:
                    self._prompt_due = False
                    self._append_prompt(out.prompt_logprobs or [])
                if out.scheduled_at is not None:
                    self._scheduled_at = out.scheduled_at
                self._prompt_tokens = out.prompt_tokens or self._prompt_tokens
                self._cached_tokens = out.cached_prompt_tokens
                tokens = self._choice_tokens
                self._completion_tokens += out.completion_tokens - tokens[c]
                tokens[c] = out.completion_tokens
                if reasoner is not None:  # thinking first; tools are read in the answer
                    out.reasoning, out.text = reasoner.feed(out.text, out.token_ids)
                calls = None if parser is None else tools.feed(parser, out)
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
                if out.text or out.reasoning or out.token_ids or calls or end is not None:
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
