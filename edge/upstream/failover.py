"""Retries and mid-stream continuation behind the `UpstreamCall` interface.

`FailoverCall` runs one generation as a series of `GenerateCall` attempts, each on another
worker, never twice on the same one, at most `max_tries` in all:

- Before anything was forwarded, a refusal or failure with UNAVAILABLE (worker gone,
  draining, connection refused), RESOURCE_EXHAUSTED, or a broken upstream stream (a
  worker killed mid-call can end it INTERNAL or UNKNOWN, a 502) is retried on another
  worker, while
  the retry budget (`--retry-budget` seconds from the failure) lasts. The response never
  notices: it is still waiting for its first message.
- After tokens were forwarded, a broken stream (UNAVAILABLE, a stream cut short) is
  *continued* where the request allows it (`--continue-on-failure`): the new attempt gets
  the original input plus the text already sent (chat: an assistant message with that
  text and `add_generation_prompt = false`; raw prompt: prompt + text), `max_tokens` and
  `min_tokens` reduced by the tokens already produced. Only its new tokens are forwarded.
  Otherwise the failure reaches the client as its final `event: error`.

Messages keep their own attempt's indices: `worker` and `request_id` always name the
attempt the last message came from, so the response's event ids name where each event
can be resumed (the continuing generation after a continuation). The continuation's
`final.usage` counts every completion token of the request.

Each attempt is counted for its pool (outcome and TTFT when it ends or gets its first
token, mean inter-token latency once when it ends) and holds one in-flight slot on its
worker; failures of a dead or broken worker also count toward its
passive failure marking.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from edge.config import RoutingConfig
from edge.errors import ApiError, from_status
from edge.obs import tracing
from edge.obs.outcomes import CANCELLED, PoolMetrics
from edge.upstream.calls import GenerateCall, Sink, UpstreamCall
from edge.upstream.continuation import (
    continuation_start,
    final_outcome,
    may_continue,
    whole_usage,
)
from edge.upstream.worker import Worker
from generated import sluice_pb2 as pb

log = logging.getLogger("sluice.edge")

RETRY_BEFORE_TOKENS = frozenset({"unavailable", "overloaded", "upstream_error"})
CONTINUE_AFTER = frozenset({"unavailable", "upstream_error"})
PASSIVE_FAILURES = frozenset({"unavailable", "upstream_error"})


class Picker(Protocol):
    """Where failover finds another worker and reports its attempts (the pool registry)."""

    options: RoutingConfig

    def pick(
        self,
        model: str = "",
        key: str = "",
        exclude: Collection[str] = (),
        prefer_pool: str = "",
        pool: str = "",
        prompt: Any = None,
    ) -> Worker:
        """A worker not in `exclude`; raises ApiError when there is none."""
        ...

    def pool_metrics(self, pool: str) -> PoolMetrics:
        """The outcome counters of `pool`."""
        ...

    def released(self, worker: Worker) -> None:
        """An attempt on `worker` ended (a removed worker may close now)."""
        ...


# Opens one attempt: (worker, start, timeout_s, trace_id, traceparent) -> its call.
OpenCall = Callable[[Worker, pb.StartGeneration, float | None, str, str], UpstreamCall]


@dataclass(frozen=True, slots=True)
class Route:
    """What a replacement's pick needs: the request's model, session key and prompt
    (the prompt feeds a cache_aware pool's pick; opaque here)."""

    model: str = ""
    key: str = ""
    prompt: Any = None


@dataclass(eq=False)
class _Attempt:
    worker: Worker
    call: UpstreamCall
    started: float
    base_tokens: int  # tokens forwarded before this attempt
    tokens: int = 0  # its own tokens
    next_index: int = 0  # of its next message
    first_token: float | None = None
    last_token: float = 0.0
    ended: bool = False
    span: object = None  # its tracing span (None with tracing off)


class _Forwarding:
    """A consumer's `Sink` seen through failover: each chunk is counted for its attempt
    (`_forward`) before the consumer takes it."""

    __slots__ = ("_att", "_failover", "_sink", "ready")

    def __init__(self, failover: FailoverCall, att: _Attempt, sink: Sink) -> None:
        self._failover = failover
        self._att = att
        self._sink = sink
        self.ready = sink.ready

    def take(self, msg: pb.GenerateResponse) -> None:
        self._sink.take(self._failover._forward_chunk(self._att, msg))


class FailoverCall:
    """An `UpstreamCall` over several workers (see the module docstring).

    Nothing is sent before `admitted()`; `worker` is the worker of the current attempt.
    """

    def __init__(
        self,
        picker: Picker,
        first: Worker,
        start: pb.StartGeneration,
        timeout_s: float | None,
        trace_id: str = "",
        *,
        route: Route = Route(),
        continuable: bool = True,
        open_call: OpenCall = GenerateCall,
    ) -> None:
        self._picker = picker
        self._opts = picker.options
        self._first = first
        self._start = start
        self._trace = trace_id
        self._route = route
        self._open_call = open_call
        self._deadline = time.monotonic() + timeout_s if timeout_s else None
        self._continuable = continuable and may_continue(self._opts.continue_on_failure, start)
        self._attempt: _Attempt | None = None
        self._tried: set[str] = set()
        self._peeked: pb.GenerateResponse | None = None
        self._error: ApiError | None = None
        self._forwarded = 0  # messages passed on, all attempts together
        self._tokens = 0
        self._text: list[str] = []
        self._cancelled = False
        self.continuations = 0
        # The current attempt's worker and generation id (plain fields, not properties:
        # every token event's id reads them), set where an attempt starts.
        self.worker: Worker = first
        self.request_id: str = start.request_id

    # -- UpstreamCall -------------------------------------------------------------------

    async def admitted(self) -> bool:
        if self._attempt is None:
            return await self._establish(self._first, self._start, None)
        return self._error is None

    async def read(self, sink: Sink | None = None) -> pb.GenerateResponse:
        while True:
            if self._error is not None:
                raise self._error
            att = self._attempt
            assert att is not None, "read() before admitted()"
            if self._peeked is not None:
                msg, self._peeked = self._peeked, None
                return self._forward(att, msg)
            try:
                msg = await att.call.read(None if sink is None else _Forwarding(self, att, sink))
            except ApiError as err:
                self._end(att, err.code or "upstream_error")
                await self._recover(err)
                continue
            return self._forward(att, msg)

    async def settle(self, timeout_s: float) -> bool:
        att = self._attempt
        return att is not None and await att.call.settle(timeout_s)

    def cancel(self) -> None:
        self._cancelled = True
        att = self._attempt
        if att is not None:
            att.call.cancel()
            self._end(att, CANCELLED)

    # -- attempts -----------------------------------------------------------------------

    async def _establish(
        self, worker: Worker | None, start: pb.StartGeneration, failure: ApiError | None
    ) -> bool:
        """Attempts from `worker` on until one is accepted. On giving up, the error to
        report is `failure` if given (a stream already under way), else the last one."""
        budget_end: float | None = None
        last: ApiError | None = None
        while worker is not None:
            if worker.closed:  # removed (admin API) after it was picked: try another
                last = from_status(grpc.StatusCode.UNAVAILABLE, "the worker left its pool")
                self._tried.add(worker.address)
            else:
                att = self._open(worker, start)
                if await att.call.admitted():
                    return True
                try:  # refused, or over already (a very short generation): read to know
                    self._peeked = await att.call.read()
                    return True
                except ApiError as err:
                    self._end(att, err.code or "upstream_error")
                    last = err
            if budget_end is None:
                budget_end = time.monotonic() + self._opts.retry_budget_s
            worker = self._replacement(last, RETRY_BEFORE_TOKENS, budget_end)
        self._error = failure or last or from_status(grpc.StatusCode.UNAVAILABLE, "no worker")
        return False

    async def _recover(self, err: ApiError) -> None:
        """A running attempt failed: retry or continue elsewhere, or raise `err`."""
        budget_end = time.monotonic() + self._opts.retry_budget_s
        if self._forwarded == 0:  # nothing forwarded yet: a plain retry
            worker = self._replacement(err, RETRY_BEFORE_TOKENS, budget_end)
            if not await self._establish(worker, self._start, err if worker is None else None):
                assert self._error is not None
                raise self._error
            return
        if not self._continuable:
            raise err
        worker = self._replacement(err, CONTINUE_AFTER, budget_end)
        if worker is None:
            raise err
        n = self.continuations + 1
        start = continuation_start(self._start, "".join(self._text), self._tokens, n)
        if start.sampling.HasField("max_tokens") and start.sampling.max_tokens == 0:
            self._peeked = self._length_final()  # every token was sent; only `final` was lost
            return
        if not await self._establish(worker, start, err):
            raise err
        self.continuations = n
        self._picker.pool_metrics(self.worker.pool).continuations += 1
        log.info(
            "request %s continued on %s after %d token(s) (%s)",
            self._start.request_id,
            self.worker.address,
            self._tokens,
            err.code,
        )

    def _replacement(
        self, err: ApiError, retryable: frozenset[str], budget_end: float
    ) -> Worker | None:
        """Another worker to try after `err`, or None (not retryable, out of tries/time)."""
        now = time.monotonic()
        if self._cancelled or (err.code or "") not in retryable:
            return None
        if len(self._tried) >= self._opts.max_tries or now > budget_end:
            return None
        if self._deadline is not None and now >= self._deadline:
            return None
        try:
            route = self._route
            return tracing.route(
                self._picker.pick,
                route.model,
                route.key,
                exclude=self._tried,
                prefer_pool=self.worker.pool,
                prompt=route.prompt,
            )
        except ApiError:
            return None

    def _open(self, worker: Worker, start: pb.StartGeneration) -> _Attempt:
        if self._cancelled:
            raise from_status(grpc.StatusCode.CANCELLED, "the generation was cancelled")
        now = time.monotonic()
        timeout = None if self._deadline is None else max(0.001, self._deadline - now)
        continuation = 0 if start is self._start else self.continuations + 1
        span = tracing.start_attempt(
            worker.address, worker.pool, len(self._tried) + 1, continuation
        )
        parent = tracing.traceparent(span) if span is not None else ""
        call = self._open_call(worker, start, timeout, self._trace, parent)
        att = _Attempt(worker, call, now, self._tokens, span=span)
        worker.in_flight += 1
        self._tried.add(worker.address)
        self._attempt = att
        self.worker, self.request_id = worker, call.request_id
        return att

    def _end(self, att: _Attempt, outcome: str) -> None:
        """Once per attempt: release its slot, count its outcome and mean inter-token gap."""
        if att.ended:
            return
        att.ended = True
        att.worker.in_flight -= 1
        metrics = self._picker.pool_metrics(att.worker.pool)
        ttft = itl = None
        if att.first_token is not None:
            ttft = att.first_token - att.started
            if att.tokens > 1:
                gaps = att.tokens - 1
                itl = (att.last_token - att.first_token) / gaps
                metrics.itl.observe(itl, gaps)
        metrics.outcome(outcome, ttft, itl_s=itl)
        if outcome in PASSIVE_FAILURES:
            att.worker.failed()
        self._picker.released(att.worker)
        if att.span is not None:
            tracing.end_attempt(att.span, outcome, att.tokens)

    def _forward(self, att: _Attempt, msg: pb.GenerateResponse) -> pb.GenerateResponse:
        """Count and pass on one message of the current attempt (its index untouched)."""
        if msg.HasField("chunk"):
            return self._forward_chunk(att, msg)
        self._forwarded += 1
        att.next_index = msg.index + 1
        if not att.ended:
            whole_usage(msg.final.usage, att.base_tokens)
        self._end(att, final_outcome(msg.final))
        return msg

    def _forward_chunk(self, att: _Attempt, msg: pb.GenerateResponse) -> pb.GenerateResponse:
        self._forwarded += 1
        att.next_index = msg.index + 1
        now = time.monotonic()
        if att.first_token is None:
            att.first_token = now
            self._picker.pool_metrics(att.worker.pool).ttft.observe(now - att.started)
        att.last_token = now
        chunk = msg.chunk
        n = len(chunk.token_ids)
        att.tokens += n
        self._tokens += n
        if self._continuable:
            self._text.append(chunk.text)
        return msg

    def _length_final(self) -> pb.GenerateResponse:
        """Every token was sent and only the `final` was lost: make it (indexed as the one
        the broken attempt would have sent next)."""
        final = pb.Final(reason=pb.FINISH_REASON_LENGTH)
        final.usage.completion_tokens = self._tokens
        att = self._attempt
        index = att.next_index if att is not None else 0
        return pb.GenerateResponse(request_id=self.request_id, index=index, final=final)
