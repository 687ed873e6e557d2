"""One generation over HTTP: the ASGI response that runs it, as SSE or as one JSON body.

- The body runs in the request's own task: read one upstream message, write its event, and
  again. Over sessions the call hands chunks to `take` from its reader's task while the body
  is parked in `read`: no wake of this task, straight onto the connection (`edge.stream.wire`).
- One watcher task notices the client leaving (it cancels the body, whose `finally`
  cancels the call, so the worker aborts at once) and owns the stream's one deadline: the
  commit to 200 after `--first-byte` if the worker has not answered, then a heartbeat
  whenever nothing was written for `--heartbeat` (it moves only when it fires).

Order of a stream: wait (at most `--first-byte`) for the worker to answer, so a refusal
still gets its HTTP status (429, 400, ...); then the 200 and SSE headers, the role chunk,
one event per upstream chunk, the finish chunk, the usage chunk if asked, `data: [DONE]`.
A failure after the 200 is a final `event: error` without `id:` (a client's Last-Event-ID
stays at the last event it got whole; its data repeats it as `last_event_id`) instead of
the finish, with no `[DONE]`. Event ids and numbering: `edge.stream.framing`. A client
that reads slowly makes the writes wait; the call's chunks then queue, flow control holds
the worker back, and it merges the tokens it makes meanwhile into larger messages. With
`--sse-gzip` and a client that accepts it, the body is gzip, flushed at every write.
"""

from __future__ import annotations

import asyncio
import logging
import time
from time import perf_counter_ns
from typing import Any

import grpc
import orjson
from starlette.types import Message, Receive, Scope, Send

from edge.errors import ApiError, Dialect, dialect_of, from_status, internal_error
from edge.obs.record import RequestRecord, record_of
from edge.stream import sse
from edge.stream.drive import write_now
from edge.stream.framing import STAMP_FIELD, Framer
from edge.stream.gzip import CONTENT_ENCODING, VARY, Gzip, accepts_gzip
from edge.stream.job import Job, final_error, note_final, read_prompts
from edge.stream.wire import Wire
from generated import sluice_pb2 as pb

log = logging.getLogger("sluice.edge")

WORKER_HEADER = b"x-sluice-worker"
DONE = b"[DONE]"
ERROR_EVENT = b"error"
HEARTBEAT = sse.encode_comment("keep-alive")
STATUS_SETTLE_S = 2.0  # after `final`, how long to wait for the RPC's OK before cancelling
DRAINING = from_status(
    grpc.StatusCode.UNAVAILABLE, "this edge is shutting down; resume from the last event id"
)
HTTP10_STREAM = ApiError(
    505,
    "streaming needs HTTP/1.1 (a chunked body); send the request over HTTP/1.1, or with "
    '"stream": false',
    code="http_version_not_supported",
)


class GenerationResponse:
    """ASGI app for one generation (see the module docstring)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.call = job.call
        self.fmt = job.fmt
        self._framer = Framer(job)
        self._plain = not (job.rich or job.logprobs)  # text events only
        self._last_id = b""  # of the last event written (a drain error names it)
        self._running = True  # the body has not returned yet
        self._committed = False  # the response's start went out
        self._complete = False  # its last byte went out
        self._busy = False  # the body is inside `send`
        self._watcher_write: asyncio.Future[None] | None = None
        self._send: Send | None = None  # the body's `send`, for `take`
        self._wire: Wire | None = None  # the connection itself, once the 200 went out
        self._flushing: asyncio.Future[None] | None = None  # a `take` write that waited
        self._flushing_id = self._flushing_data = b""  # ... and its event's id and bytes
        self._unsent = b""  # gzip bytes a cancelled write did not send (`_keep_unsent`)
        self._gone = False  # the client left: the watcher cancelled the body
        self._last_ns = 0  # perf_counter_ns of the last write
        self._last_event_ns = 0  # ... of the last token event
        self._t0_ns = time.perf_counter_ns()
        self._record: RequestRecord | None = None
        self._dialect: Dialect = "openai"  # the error shape of the API called
        self._gzip_ok = False  # the client accepts gzip (and the edge gives it)
        self._gzip: Gzip | None = None  # the body's compressor, once the 200 says gzip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        job, metrics = self.job, self.job.metrics
        rec = self._record = record_of(scope)
        rec.request_id, rec.trace_id, rec.model = job.request_id, job.trace_id, job.model
        self._dialect = dialect_of(scope.get("path", ""))
        # Not with the audit log's bodies kept: they are recorded as they go out.
        self._gzip_ok = job.config.sse_gzip and not rec.bodies and accepts_gzip(scope)
        if job.stream and scope.get("http_version") == "1.0":
            # An HTTP/1.0 client cannot read a chunked body, and uvicorn cannot send a
            # close-delimited one: say so before anything starts.
            self.call.cancel()
            await self._send_json(send, 505, HTTP10_STREAM.json(self._dialect))
            return
        metrics.stream_started()
        if job.resumed:
            metrics.resumes[job.resumed] += 1
        task = asyncio.current_task()
        assert task is not None
        self._send = send
        watcher = asyncio.create_task(self._watch(receive, send, task))
        try:
            await self._run(send)
        except asyncio.CancelledError:
            if not self._gone:
                # The server's cancel (drain grace over): a last retryable error (an event,
                # or a 503 before anything was sent) rather than a cut connection, then go.
                # An event `take` could not write yet is dropped (not with gzip: unsent).
                if self._flushing is not None:
                    self._flushing.cancel()
                    self._flushing = None
                    self._keep_unsent(self._flushing_data, self._flushing_id)
                if not self._complete:
                    await self._fail(send, DRAINING)
                raise
            task.uncancel()  # our own cancel (the client left), not the server's
            metrics.client_disconnects[rec.route] += 1
        finally:
            rec.worker = self.call.worker.key
            self._running = False
            if self._flushing is not None:
                self._flushing.cancel()
            watcher.cancel()
            self.call.cancel()  # a no-op once the RPC ended; else the worker aborts now
            metrics.stream_ended()  # before the await: a cancel there must not skip it
            await asyncio.gather(watcher, return_exceptions=True)

    # -- the body ---------------------------------------------------------------------

    async def _run(self, send: Send) -> None:
        try:
            if self.job.stream:
                await self._stream(send)
            else:
                await self._whole(send)
        except ApiError as err:
            self.job.metrics.upstream_errors[err.code or "unknown"] += 1
            await self._fail(send, err)
        except Exception:
            log.exception("generation %s failed in the edge", self.job.request_id)
            await self._fail(send, internal_error())

    async def _stream(self, send: Send) -> None:
        call = self.call
        first: pb.GenerateResponse | None = None
        if not await call.admitted():
            first = await call.read()  # raises the refusal; or a generation over already
        elif self.job.resume is None:  # the prompts' messages, when the opening shows them
            first = await read_prompts(call, self.fmt)
        await self._commit(send)
        while True:
            # Parked in read, the call hands chunks to `take` from its reader's task.
            msg = first or await call.read(self)
            first = None
            rx_ns = perf_counter_ns()
            if msg.WhichOneof("kind") == "chunk":
                if data := self._token_bytes(msg):
                    await self._write(send, data, eid=self._framer.framed_id)
                    self._event_written(msg.chunk, rx_ns, self._last_ns)
                continue
            await self._ending(send, msg.final, msg.index)
            await call.settle(STATUS_SETTLE_S)  # let the RPC's OK land before `cancel`
            return

    # -- the token path: `take` (the call's reader, no wake) or the body's loop ----------

    def ready(self) -> bool:
        """`Sink.ready`: nothing of ours is mid-write (the watcher's, or a `take` that
        waited for the client), so a chunk can be written now, in order."""
        return self._flushing is None and self._watcher_write is None and not self._busy

    def take(self, msg: pb.GenerateResponse) -> None:
        """`Sink.take`: one chunk's event written from the upstream reader's task, at once
        unless the client lags; the rest of that write is then `_flushing`, and chunks queue
        in the call until it is done. Plain text onto the connection: no calls between."""
        rx_ns = perf_counter_ns()
        chunk, job = msg.chunk, self.job
        if self._plain and not chunk.reasoning:
            if not (text := chunk.text):
                return
            data = self._framer.text_event(text, msg.index + 1, job.stamps and msg.worker_time_ns)
        elif not (data := self._token_bytes(msg)):
            return
        if (gz := self._gzip) is not None:
            data = gz.chunk(data)
        if (wire := self._wire) is None or not wire.write(data):
            assert self._send is not None
            self._flushing = write_now(None, self._send, data)
        if self._flushing is None:
            self._last_id = self._framer.framed_id
        else:  # the client's once it is written
            self._flushing_id, self._flushing_data = self._framer.framed_id, data
        self._last_ns = now = perf_counter_ns()
        self._event_written(chunk, rx_ns, now)

    def _token_bytes(self, msg: pb.GenerateResponse) -> bytes:
        """One chunk's framed event(s); empty when it makes none."""
        job, chunk = self.job, msg.chunk
        if self._plain and not chunk.reasoning:
            text = chunk.text
            stamp = msg.worker_time_ns if job.stamps else 0
            return self._framer.text_event(text, msg.index + 1, stamp) if text else b""
        lps = self.fmt.logprobs(chunk) if job.logprobs else None
        if job.rich or chunk.reasoning:  # thinking (a worker's reasoning parser) is rich
            return self._framer.frame(self.fmt.events(chunk, lps, self._framer.seq), msg.index)
        if not chunk.text and lps is None:
            return b""
        event = self.fmt.delta(chunk.text, lps)
        if job.stamps:  # only with Job.stamps: the chunk's JSON gets one more field
            event = event[:-1] + STAMP_FIELD % msg.worker_time_ns
        return self._framer.event(event, msg.index + 1)

    def _event_written(self, chunk: pb.TokenChunk, rx_ns: int, now: int) -> None:
        job, metrics = self.job, self.job.metrics
        if len(chunk.token_ids) > 1:
            metrics.merged_chunks += len(chunk.token_ids)
        metrics.event_written(rx_ns, now, self._last_event_ns)
        if not self._last_event_ns and not job.resumed and self._record is not None:
            metrics.ttft[self._record.route].observe((now - self._t0_ns) * 1e-9)
        self._last_event_ns = now

    async def _ending(self, send: Send, final: pb.Final, index: int) -> None:
        """The last events (finish [+ usage] + [DONE] for chat), or for a failed final
        the error. Their ids point at the final message itself with a part number, the
        very last one `PART_DONE`, so a client cut off among them resumes by replaying the
        final and gets only the events it lacks."""
        if (error := final_error(final)) is not None:
            raise error
        note_final(self._record, final, self.job.request_id)
        data = self._framer.frame(self.fmt.ending(final, self._framer.seq), index, final=True)
        if self.job.keep is not None:
            await self.job.keep()
        await self._write(send, data, more=False, eid=self._framer.framed_id)

    async def _whole(self, send: Send) -> None:
        call, fmt, logprobs = self.call, self.fmt, self.job.logprobs
        await call.admitted()  # a refusal is raised by the read
        while True:
            msg = await call.read()
            if msg.WhichOneof("kind") == "chunk":
                fmt.collect(msg.chunk, fmt.logprobs(msg.chunk) if logprobs else None)
                continue
            if (error := final_error(final := msg.final)) is not None:
                raise error
            note_final(self._record, final, self.job.request_id)
            body = fmt.whole(final, logprobs)
            if self.job.keep is not None:
                await self.job.keep()
            await self._send_json(send, 200, orjson.dumps(body))
            await call.settle(STATUS_SETTLE_S)
            return

    async def _fail(self, send: Send, err: ApiError) -> None:
        """An error as an HTTP status before the 200, as the final event after it."""
        if not self._committed:
            await self._send_json(send, err.status, err.json(self._dialect), err.headers())
        elif not self._complete:
            last = self._last_id.decode() if self._last_id else None
            data = err.event_json(last, self._dialect)
            await self._write(send, sse.encode_data(data, event=ERROR_EVENT), more=False)

    # -- the watcher ------------------------------------------------------------------

    async def _watch(self, receive: Receive, send: Send, body: asyncio.Task[Any]) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.job.config
        deadline = loop.time() + cfg.commit_wait_s() if self.job.stream else None
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    message: Message = await receive()
            except TimeoutError:
                deadline = loop.time() + await self._idle(send, cfg.heartbeat_s)
                continue
            # uvicorn also reports a disconnect once the response is complete; only an
            # earlier one is the client leaving.
            if message["type"] == "http.disconnect":
                if self._running and not self._complete:
                    self._gone = True
                    body.cancel()
                return

    async def _idle(self, send: Send, heartbeat_s: float) -> float:
        """The deadline passed: commit, or send a heartbeat if nothing went out for
        `heartbeat_s`. Returns the seconds until the next deadline."""
        if not self._running or self._complete or self._busy:
            return heartbeat_s
        idle_s = (time.perf_counter_ns() - self._last_ns) * 1e-9
        if self._committed and idle_s < heartbeat_s:
            return heartbeat_s - idle_s
        # The body waits for this write (`_write`) before it writes itself.
        fut = self._watcher_write = asyncio.get_running_loop().create_future()
        try:
            if not self._committed:
                await self._commit(send, watcher=True)
            else:
                self.job.metrics.heartbeats += 1
                await self._write(send, HEARTBEAT, watcher=True)
        finally:
            self._watcher_write = None
            if not fut.done():
                fut.set_result(None)
        return heartbeat_s

    # -- writing ----------------------------------------------------------------------

    async def _commit(self, send: Send, *, watcher: bool = False) -> None:
        """The 200, the SSE headers and the opening event (once, by whoever comes first)."""
        if self._committed:  # the watcher's opening first
            if self._watcher_write is not None and not watcher:
                await asyncio.shield(self._watcher_write)
            return
        self._committed = self._busy = True
        headers = self._headers(sse.HEADERS)
        if self.job.config.sse_gzip:  # the same request may be answered gzip or not
            headers.append(VARY)
        if self._gzip_ok:
            self._gzip, headers = Gzip(), [*headers, CONTENT_ENCODING]
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
        finally:
            self._busy = False
        self._wire = Wire.behind(self._record)
        if self.job.resume is None or self._framer.replay:
            data = self._framer.frame(self.fmt.opening_events(self._framer.seq), 0, opening=True)
            if data:
                await self._write(send, data, watcher=watcher, eid=self._framer.framed_id)

    async def _write(
        self, send: Send, data: bytes, *, more: bool = True, watcher: bool = False, eid: bytes = b""
    ) -> None:
        """Send `data`; `eid`: the id of its last event, the client's once it is sent."""
        if self._watcher_write is not None and not watcher:
            # Shielded: the body being cancelled here must not cancel the watcher's future
            # (its drain error event waits on it again).
            await asyncio.shield(self._watcher_write)
        flushing = self._flushing
        if flushing is not None:  # a `take` write the client has not read yet
            self._busy = True
            try:
                await asyncio.shield(flushing)
                self._last_id = self._flushing_id
            finally:
                self._busy = False
                if flushing.done():  # else (we were cancelled) `_drop_flush` ends it
                    self._flushing = None
        if not more:
            self._complete = True
        if (gz := self._gzip) is not None:
            data, self._unsent = self._unsent + (gz.chunk(data) if more else gz.last(data)), b""
        if not (more and self._wire is not None and self._wire.write(data)):
            self._busy = True
            try:
                await send({"type": "http.response.body", "body": data, "more_body": more})
            except asyncio.CancelledError:
                self._keep_unsent(data, eid)
                raise
            finally:
                self._busy = False
        if eid:
            self._last_id = eid
        self._last_ns = time.perf_counter_ns()

    def _keep_unsent(self, data: bytes, eid: bytes) -> None:
        """A gzip write cancelled before it went out (uvicorn's send waits for the client,
        then writes) goes out first with the next one (the drain error), as the compressor
        has taken its bytes."""
        if self._gzip is not None:
            self._unsent, self._last_id = self._unsent + data, eid or self._last_id

    def _headers(self, base: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        headers = [*base, (b"x-request-id", self.job.trace_id.encode())]
        if self.job.name_worker:
            headers.append((WORKER_HEADER, self.call.worker.key.encode()))
        return headers

    async def _send_json(
        self, send: Send, status: int, body: bytes, extra: dict[str, str] | None = None
    ) -> None:
        headers = self._headers(
            [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        )
        headers.extend((k.encode(), v.encode()) for k, v in (extra or {}).items())
        self._committed = self._busy = True
        try:
            await send({"type": "http.response.start", "status": status, "headers": headers})
        finally:
            self._busy = False
        await self._write(send, body, more=False)
