"""Retries and mid-stream continuation behind the `UpstreamCall` interface.

`FailoverCall` runs one generation as a series of `GenerateCall` attempts, each on another
worker, never twice on the same one, at most `max_tries` in all:

- Before anything was forwarded, a refusal or failure with UNAVAILABLE (worker gone,
  draining, connection refused) or RESOURCE_EXHAUSTED is retried on another worker, while
  the retry budget (`--retry-budget` seconds from the failure) lasts. The response never
  notices: it is still waiting for its first message.
- After tokens were forwarded, a broken stream (UNAVAILABLE, a stream cut short) is
  *continued* where the request allows it (`--continue-on-failure`): the new attempt gets
  the original input plus the text already sent (chat: an assistant message with that
  text and `add_generation_prompt = false`; raw prompt: prompt + text), `max_tokens` and
  `min_tokens` reduced by the tokens already produced. Only its new tokens are forwarded.
  Otherwise the failure reaches the client as its final `event: error`.

Messages leave with gapless indices 0, 1, 2... across attempts and the original request
id, so the response's event ids continue without a gap or repeat; the continuation's
`final.usage` counts every completion token of the request.

Each attempt is counted for its pool (outcome, TTFT, inter-token latency) and holds one
in-flight slot on its worker; failures of a dead or broken worker also count toward its
passive failure marking.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import grpc

from edge.continuation import continuation_start, final_outcome, may_continue
from edge.errors import ApiError, from_status
from edge.metrics import Message, Receive, Scope, Send
from edge.pool_metrics import CANCELLED
from edge.pool_worker import PoolWorker
from edge.pools import PoolRegistry
from edge.resume import ResumeCodec
from edge.stream import GenerationResponse, Job
from edge.upstream import GenerateCall
from generated import sluice_pb2 as pb

log = logging.getLogger("sluice.edge")

WORKER_HEADER = b"x-sluice-worker"
RETRY_BEFORE_TOKENS = frozenset({"unavailable", "overloaded"})
CONTINUE_AFTER = frozenset({"unavailable", "upstream_error"})
PASSIVE_FAILURES = frozenset({"unavailable", "upstream_error"})


@dataclass(eq=False)
class _Attempt:
    worker: PoolWorker
    call: GenerateCall
    request_id: str
    started: float
    base_tokens: int  # tokens forwarded before this attempt
    delivered: bool = False  # forwarded a message (so it owns a segment)
    first_token: float | None = None
    last_token: float = 0.0
    ended: bool = False


class FailoverCall:
    """An `UpstreamCall` over several workers (see the module docstring).

    Nothing is sent before `admitted()`; `worker` is the worker of the current attempt.
    """

    def __init__(
        self,
        registry: PoolRegistry,
        first: PoolWorker,
        start: pb.StartGeneration,
        timeout_s: float | None,
        trace_id: str = "",
        key: str = "",
        model: str = "",
    ) -> None:
        self._registry = registry
        self._opts = registry.options
        self._first = first
        self._start = start
        self._trace = trace_id
        self._key = key
        self._model = model
        self._deadline = time.monotonic() + timeout_s if timeout_s else None
        self._continuable = may_continue(self._opts.continue_on_failure, start.sampling)
        self._attempt: _Attempt | None = None
        self._tried: set[str] = set()
        self._peeked: pb.GenerateResponse | None = None
        self._error: ApiError | None = None
        self._next_index = 0
        self._tokens = 0
        self._text: list[str] = []
        self._cancelled = False
        # (first combined index, request id, worker key) of each attempt that delivered.
        self._segments: list[tuple[int, str, str]] = []
        self.continuations = 0

    @property
    def worker(self) -> PoolWorker:
        return self._attempt.worker if self._attempt is not None else self._first

    def position(self, index: int) -> tuple[str, str, int]:
        """Where message `index` (as forwarded) lives upstream: (request id, worker key,
        index in that worker's generation), which is what a `Resume` needs. An index
        before the first message maps to the first generation, index -1."""
        for first, request_id, key in reversed(self._segments):
            if index >= first:
                return request_id, key, index - first
        if self._segments:
            _, request_id, key = self._segments[0]
            return request_id, key, index
        return self._start.request_id, self.worker.key, index

    # -- UpstreamCall -------------------------------------------------------------------

    async def admitted(self) -> bool:
        if self._attempt is None:
            return await self._establish(self._first, self._start, None)
        return self._error is None

    async def read(self) -> pb.GenerateResponse:
        while True:
            if self._error is not None:
                raise self._error
            att = self._attempt
            assert att is not None, "read() before admitted()"
            if self._peeked is not None:
                msg, self._peeked = self._peeked, None
                return self._forward(att, msg)
            try:
                msg = await att.call.read()
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
        self, worker: PoolWorker | None, start: pb.StartGeneration, failure: ApiError | None
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
        if self._next_index == 0:  # nothing forwarded yet: a plain retry
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
        self._registry.pool_metrics(self.worker.pool).continuations += 1
        log.info(
            "request %s continued on %s after %d token(s) (%s)",
            self._start.request_id,
            self.worker.address,
            self._tokens,
            err.code,
        )

    def _replacement(
        self, err: ApiError, retryable: frozenset[str], budget_end: float
    ) -> PoolWorker | None:
        """Another worker to try after `err`, or None (not retryable, out of tries/time)."""
        now = time.monotonic()
        if self._cancelled or (err.code or "") not in retryable:
            return None
        if len(self._tried) >= self._opts.max_tries or now > budget_end:
            return None
        if self._deadline is not None and now >= self._deadline:
            return None
        try:
            return self._registry.pick(
                self._model, self._key, exclude=self._tried, prefer_pool=self.worker.pool
            )
        except ApiError:
            return None

    def _open(self, worker: PoolWorker, start: pb.StartGeneration) -> _Attempt:
        if self._cancelled:
            raise from_status(grpc.StatusCode.CANCELLED, "the generation was cancelled")
        now = time.monotonic()
        timeout = None if self._deadline is None else max(0.001, self._deadline - now)
        call = GenerateCall(worker, start, timeout, self._trace)
        att = _Attempt(worker, call, start.request_id, now, self._tokens)
        worker.in_flight += 1
        self._tried.add(worker.address)
        self._attempt = att
        return att

    def _end(self, att: _Attempt, outcome: str) -> None:
        """Once per attempt: release its slot, count its outcome."""
        if att.ended:
            return
        att.ended = True
        att.worker.in_flight -= 1
        ttft = None if att.first_token is None else att.first_token - att.started
        self._registry.pool_metrics(att.worker.pool).outcome(outcome, ttft)
        if outcome in PASSIVE_FAILURES:
            att.worker.failed()
        self._registry.released(att.worker)

    def _forward(self, att: _Attempt, msg: pb.GenerateResponse) -> pb.GenerateResponse:
        """Count, renumber and pass on one message of the current attempt."""
        if not att.delivered:
            att.delivered = True
            self._segments.append((self._next_index, att.request_id, att.worker.key))
        if msg.WhichOneof("kind") == "chunk":
            now = time.monotonic()
            n = len(msg.chunk.token_ids)
            metrics = self._registry.pool_metrics(att.worker.pool)
            if att.first_token is None:
                att.first_token = now
                metrics.ttft.observe(now - att.started)
            elif n:
                metrics.itl.observe((now - att.last_token) / n, n)
            att.last_token = now
            self._tokens += n
            if self._continuable:
                self._text.append(msg.chunk.text)
        else:
            if att.base_tokens and not att.ended:
                usage = msg.final.usage
                usage.completion_tokens += att.base_tokens
                # The continuation's prompt held the text sent before; count it once.
                usage.prompt_tokens = max(0, usage.prompt_tokens - att.base_tokens)
            self._end(att, final_outcome(msg.final))
        msg.index = self._next_index
        msg.request_id = self._start.request_id
        self._next_index += 1
        return msg

    def _length_final(self) -> pb.GenerateResponse:
        final = pb.Final(reason=pb.FINISH_REASON_LENGTH)
        final.usage.completion_tokens = self._tokens
        return pb.GenerateResponse(final=final)


class RoutedResponse(GenerationResponse):
    """A generation's response over a `FailoverCall`.

    It names its worker (`x-sluice-worker: <worker key>`: the worker that accepted a
    stream, or that finished a whole JSON response), and keeps resume exact across
    failovers: each event id names the generation and worker that hold the event's last
    message, with the cursor in that generation's own indices (`FailoverCall.position`),
    so a `Last-Event-ID` after a continuation resumes from the continuing worker.
    """

    def __init__(self, job: Job, call: FailoverCall, codec: ResumeCodec) -> None:
        super().__init__(job)
        self.call = call
        self._codec = codec
        self._segment = ("", "")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_worker(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                headers.append((WORKER_HEADER, self.call.worker.key.encode()))
                message["headers"] = headers
            await send(message)

        await super().__call__(scope, receive, send_with_worker)

    def _event(self, data: bytes, cursor: int, event: bytes | None = None, part: int = 0) -> bytes:
        # A token event's cursor is the index after its last message; an ending part's
        # is the final message's own index (see GenerationResponse._ending).
        last = cursor if part else cursor - 1
        request_id, key, local = self.call.position(last)
        if (request_id, key) != self._segment:
            self._segment = (request_id, key)
            self._id_prefix = self._codec.prefix(request_id, key)
        return super()._event(data, local if part else local + 1, event, part)
