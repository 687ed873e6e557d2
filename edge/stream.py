"""One generation over HTTP: the ASGI response that runs it, as SSE or as one JSON body.

Three tasks per generation: the upstream reader (gRPC -> `StreamBuffer`), the writer
(buffer -> HTTP, this response's own task) and a disconnect watcher. A client that goes
away cancels the writer at once, and the writer's `finally` cancels the gRPC call, so the
worker aborts the engine request without waiting for the next token or heartbeat.

Order of a stream: wait (at most `first_byte_s`) for the worker to answer, so a refusal
still gets its HTTP status (429, 400, ...); then the 200 and SSE headers, the role chunk,
deltas (merged when the client falls behind), the finish chunk, the usage chunk if asked,
and `data: [DONE]`. A failure after the 200 is a final `event: error` instead of the
finish, with no `[DONE]`. Every event carries an `id:`; comments keep idle streams alive.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import orjson

from edge import sse
from edge.buffer import Batch, StreamBuffer
from edge.calls import UpstreamCall
from edge.config import EdgeConfig
from edge.errors import ApiError, from_status, from_status_code_number, internal_error
from edge.logs import GENERATION, ROUTE
from edge.metrics import Message, Metrics, Receive, Scope, Send
from edge.openai_format import FINISH_REASONS, ChunkFormat, logprob_entries
from edge.resume import PART_DONE, PART_FINISH, PART_USAGE, ResumePoint
from generated import sluice_pb2 as pb

log = logging.getLogger("sluice.edge")

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
JSON_TYPE = (b"content-type", b"application/json")
DONE = b"[DONE]"
ERROR_EVENT = b"error"
HEARTBEAT = sse.encode_comment("keep-alive")
STATUS_SETTLE_S = 2.0  # after `final`, how long to wait for the RPC's OK before cancelling


@dataclass(slots=True)
class Job:
    """What a handler hands to the response: one validated generation, ready to run."""

    route: str
    request_id: str  # ours, unique: the worker's request id, in chunk and event ids
    trace_id: str  # the client's X-Request-Id if it sent a usable one, else request_id
    call_factory: Callable[[], UpstreamCall]  # called inside the response's own task
    fmt: ChunkFormat
    stream: bool
    logprobs: bool
    config: EdgeConfig
    metrics: Metrics
    id_prefix: bytes  # signed head of every event id (`ResumeCodec.prefix`)
    resume: ResumePoint | None = None  # set when this response continues a stream
    # How this response continues a generation: "" (a new one), "last_event_id" or
    # "stream_link" (a first GET of /v1/streams/{token}); counted as resumes.
    resumed: str = ""
    stamps: bool = False  # put the worker's `worker_time_ns` into chunks (benchmarks)


class GenerationResponse:
    """ASGI app for one generation (see module docstring)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.fmt = job.fmt
        self._id_prefix = job.id_prefix
        self._seq = job.resume.seq + 1 if job.resume else 0
        self._retry_pending = True
        self._committed = False
        self._complete = False
        self.final: pb.Final | None = None  # the worker's, once received (access log)
        self._t0_ns = time.perf_counter_ns()
        self._last_event_ns = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        metrics = self.job.metrics
        metrics.streams_in_flight += 1
        scope[GENERATION] = self  # for the access log (edge.logs)
        if self.job.resumed:
            metrics.resumes[self.job.resumed] += 1
        work = asyncio.create_task(self._run(send))
        watcher = asyncio.create_task(_wait_disconnect(receive))
        try:
            await asyncio.wait((work, watcher), return_when=asyncio.FIRST_COMPLETED)
            # uvicorn also reports a disconnect once the response is complete; only an
            # earlier one is the client leaving.
            if not work.done() and not self._complete:
                metrics.client_disconnects[scope.get(ROUTE, self.job.route)] += 1
                work.cancel()
            await asyncio.wait((work,))
        finally:
            work.cancel()
            watcher.cancel()
            results = await asyncio.gather(work, watcher, return_exceptions=True)
            metrics.streams_in_flight -= 1
        err = results[0]
        if isinstance(err, Exception):
            log.error("generation %s failed in the edge", self.job.request_id, exc_info=err)

    # -- the writer -------------------------------------------------------------------

    async def _run(self, send: Send) -> None:
        cfg = self.job.config
        buf = StreamBuffer(cfg.stream_buffer_bytes)
        call: UpstreamCall | None = None
        reader: asyncio.Task[bool] | None = None
        try:
            call = self.job.call_factory()
            reader = asyncio.create_task(self._read(call, buf))
            if self.job.stream:
                await self._stream(buf, send)
            else:
                await self._whole(buf, send)
            if buf.final_seen:
                await reader  # let the RPC's OK status land (bounded by the reader)
        except ApiError as err:  # no worker to call
            await self._send_error(send, err)
        except Exception:
            if not self._committed:
                await self._send_error(send, internal_error())
            elif not self._complete:
                event = self._event(internal_error().event_json(), buf.cursor, ERROR_EVENT)
                await self._body(send, event, more=False)
            raise
        finally:
            if call is not None:
                call.cancel()  # no-op once the RPC ended; else the worker aborts at once
            if reader is not None:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)

    async def _stream(self, buf: StreamBuffer, send: Send) -> None:
        await buf.wait_admitted(self.job.config.commit_wait_s())
        refused = buf.error_before_data()
        if refused is not None:
            await self._send_error(send, refused)
            return
        self._committed = True
        await send(
            {"type": "http.response.start", "status": 200, "headers": self._headers(SSE_HEADERS)}
        )
        opening = self.fmt.opening() if self.job.resume is None else None
        if opening is not None:
            await self._body(send, self._event(opening, 0))
        heartbeat = self.job.config.heartbeat_s
        while True:
            batch = await buf.take(heartbeat)
            if batch is None:
                self.job.metrics.heartbeats += 1
                await self._body(send, HEARTBEAT)
                continue
            out = []
            if batch.chunks > 1:
                self.job.metrics.merged_chunks += batch.chunks
            if batch.text or batch.logprobs is not None:
                data = self.fmt.delta(batch.text, batch.logprobs)
                if batch.stamp:  # only with Job.stamps: the chunk's JSON gets one more field
                    data = data[:-1] + b',"sluice_worker_time_ns":%d}' % batch.stamp
                # A delta that comes with the final message points at the final, so that a
                # client cut off right after it resumes by replaying the final.
                cursor = batch.cursor - 1 if batch.final is not None else batch.cursor
                out.append(self._event(data, cursor))
            if batch.ended:
                out.extend(self._ending(batch))
                await self._body(send, b"".join(out), more=False)
                self._observe(batch)
                return
            if out:
                await self._body(send, out[0])
                self._observe(batch)

    def _ending(self, batch: Batch) -> list[bytes]:
        """The last events: finish [+ usage] + [DONE], or one error event.

        Their ids point at the final message (cursor - 1) with a part number, so a client
        cut off among them resumes by replaying the final and gets only the parts it lacks.
        """
        final, cursor = batch.final, batch.cursor
        error = batch.error if final is None else _final_error(final)
        if error is not None:
            return [self._event(error.event_json(), cursor, ERROR_EVENT)]
        assert final is not None
        at = cursor - 1
        done = self.job.resume.part if self.job.resume else 0
        out = []
        if done < PART_FINISH:
            finish = self.fmt.finish(FINISH_REASONS[final.reason])
            out.append(self._event(finish, at, part=PART_FINISH))
        if self.fmt.include_usage and done < PART_USAGE:
            out.append(self._event(self.fmt.usage(final.usage), at, part=PART_USAGE))
        out.append(self._event(DONE, at, part=PART_DONE))
        return out

    async def _whole(self, buf: StreamBuffer, send: Send) -> None:
        texts: list[str] = []
        logprobs: list[dict[str, Any]] | None = [] if self.job.logprobs else None
        while True:
            batch = await buf.take()
            assert batch is not None
            texts.append(batch.text)
            if logprobs is not None and batch.logprobs:
                logprobs.extend(batch.logprobs)
            if not batch.ended:
                continue
            final = batch.final
            error = batch.error if final is None else _final_error(final)
            if error is not None:
                await self._send_error(send, error)
                return
            assert final is not None
            body = self.fmt.response(
                "".join(texts), FINISH_REASONS[final.reason], final.usage, logprobs
            )
            await self._send_json(send, 200, orjson.dumps(body))
            return

    def _observe(self, batch: Batch) -> None:
        """After a token event was written: the edge's overhead since its first gRPC
        message arrived, the gap since the previous event, or the time to first token."""
        if not batch.rx_ns:
            return
        now = time.perf_counter_ns()
        metrics = self.job.metrics
        metrics.write_overhead.observe((now - batch.rx_ns) * 1e-9)
        if self._last_event_ns:
            metrics.inter_event.observe((now - self._last_event_ns) * 1e-9)
        elif not self.job.resumed:
            metrics.ttft[self.job.route].observe((now - self._t0_ns) * 1e-9)
        self._last_event_ns = now

    # -- the upstream reader ----------------------------------------------------------

    async def _read(self, call: UpstreamCall, buf: StreamBuffer) -> bool:
        """gRPC -> buffer. Returns True once the RPC ended with OK after its final."""
        want_logprobs = self.job.logprobs
        stamps = self.job.stamps
        try:
            if await call.admitted():
                buf.admit()
            while True:
                msg = await call.read()
                if msg.WhichOneof("kind") == "chunk":
                    chunk = msg.chunk
                    lps = logprob_entries(chunk) if want_logprobs else None
                    stamp = msg.worker_time_ns if stamps else 0
                    await buf.put_chunk(chunk.text, lps, msg.index, stamp)
                else:
                    self.final = msg.final
                    buf.finish(msg.final, msg.index)
                    failed = _final_error(msg.final)
                    if failed is not None:
                        self.job.metrics.upstream_errors[failed.code or "unknown"] += 1
                    return await call.settle(STATUS_SETTLE_S)
        except ApiError as err:
            self.job.metrics.upstream_errors[err.code or "unknown"] += 1
            buf.fail(err)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("reading upstream for %s", self.job.request_id)
            buf.fail(internal_error())
        return False

    # -- framing helpers --------------------------------------------------------------

    def _event(self, data: bytes, cursor: int, event: bytes | None = None, part: int = 0) -> bytes:
        eid = self._id_prefix + b"%d.%d" % (self._seq, cursor)
        if part:
            eid += b"~%d" % part
        self._seq += 1
        if self._retry_pending:
            self._retry_pending = False
            return b"retry: %d\n" % self.job.config.retry_ms + sse.encode_data(
                data, id=eid, event=event
            )
        return sse.encode_data(data, id=eid, event=event)

    async def _body(self, send: Send, data: bytes, *, more: bool = True) -> None:
        if not more:
            self._complete = True
        await send({"type": "http.response.body", "body": data, "more_body": more})

    def _headers(self, base: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        return [*base, (b"x-request-id", self.job.trace_id.encode())]

    async def _send_json(
        self, send: Send, status: int, body: bytes, extra: dict[str, str] | None = None
    ) -> None:
        headers = self._headers([JSON_TYPE, (b"content-length", str(len(body)).encode())])
        headers.extend((k.encode(), v.encode()) for k, v in (extra or {}).items())
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await self._body(send, body, more=False)

    async def _send_error(self, send: Send, err: ApiError) -> None:
        if self._committed:  # pragma: no cover (errors after the 200 go through _ending)
            return
        await self._send_json(send, err.status, err.json(), err.headers())


def _final_error(final: pb.Final) -> ApiError | None:
    """A `final` that is not a success (CANCELLED, ERROR) as the error to report."""
    if final.reason in FINISH_REASONS:
        return None
    if final.HasField("error") and final.error.code:
        e = final.error
        code = from_status_code_number(e.code)
        return from_status(code, e.message, field=e.field, retry_after_ms=e.retry_after_ms)
    if final.reason == pb.FINISH_REASON_CANCELLED:
        return from_status(grpc.StatusCode.CANCELLED, "the generation was cancelled")
    return from_status(grpc.StatusCode.UNKNOWN, "the generation failed")


async def _wait_disconnect(receive: Receive) -> None:
    """Return when the client disconnects (the request body was already read)."""
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return
