"""HTTP/1.1 + chunked transfer + SSE framing over a raw asyncio socket, by bytes operations.

A load generator that parses every event into objects measures itself, not the server.
This reader works on whole socket reads: the status line and headers once per response,
then chunked decoding with `find`/slicing (and gzip's, for a gzip body), then SSE events
split on blank lines with one `split` per read. Events reach the sink as raw `bytes`
blocks (without the blank line), all stamped with the read's arrival time; interpreting
them is the driver's business.

`ResponseParser` is pure (feed it bytes, it calls the sink), so it can be tested and timed
without a socket (`selftest.py`); `SSEConnection` is the asyncio protocol around it and
`SSEClient` a keep-alive connection pool.
"""

from __future__ import annotations

import asyncio
import socket
import time
import zlib
from collections.abc import Callable
from typing import Any, Protocol

HEAD, CHUNKED, LENGTH, UNTIL_CLOSE, DONE = range(5)
MAX_ERROR_BODY = 64 * 1024


class EventSink(Protocol):
    """Receives SSE event blocks (raw bytes, no trailing blank line) with their read time."""

    def on_events(self, now_ns: int, events: list[bytes]) -> None: ...


class ProtocolError(Exception):
    """The server's bytes are not a valid HTTP/1.1 response."""


class ResponseParser:
    """Incremental parser of one HTTP/1.1 response whose body is an SSE stream.

    A non-200 response's body is kept (up to 64 KiB) in `error_body` instead of being split.
    """

    __slots__ = (
        "_crlf_left",
        "_data_left",
        "_head",
        "_inflate",
        "_left",
        "_mode",
        "_pending",
        "_sse",
        "body_bytes",
        "error_body",
        "headers",
        "keep_alive",
        "sink",
        "status",
    )

    def __init__(self, sink: EventSink) -> None:
        self.sink = sink
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.keep_alive = True
        self.body_bytes = 0  # de-chunked body bytes
        self.error_body = b""
        self._mode = HEAD
        self._head = b""
        self._data_left = 0  # chunk data still to come
        self._crlf_left = 0  # CRLF after chunk data still to skip
        self._pending = b""  # an incomplete chunk-size line
        self._left = 0  # Content-Length body still to come
        self._sse = b""  # an incomplete SSE event
        self._inflate: Any = None  # a gzip body's decoder

    @property
    def done(self) -> bool:
        return self._mode == DONE

    def feed(self, data: bytes, now_ns: int) -> None:
        """Consume one socket read."""
        if self._mode == HEAD:
            data = self._parse_head(data)
            if self._mode == HEAD or not data:
                return
        if self._mode == CHUNKED:
            self._feed_chunked(data, now_ns)
        elif self._mode == LENGTH:
            piece = data[: self._left]
            self._left -= len(piece)
            self._body(piece, now_ns)
            if self._left == 0:
                self._mode = DONE
        elif self._mode == UNTIL_CLOSE:
            self._body(data, now_ns)
        elif data.strip():
            raise ProtocolError("bytes after the end of the response")

    def eof(self, now_ns: int) -> None:
        """The connection closed; a read-until-close body ends here."""
        if self._mode == UNTIL_CLOSE:
            self._mode = DONE
        if self._sse and self.status == 200:
            # A last event without its blank line: deliver what is there.
            self.sink.on_events(now_ns, [self._sse])
            self._sse = b""

    def _parse_head(self, data: bytes) -> bytes:
        buf = self._head + data if self._head else data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > 65536:
                raise ProtocolError("response head larger than 64 KiB")
            self._head = buf
            return b""
        self._head = b""
        lines = buf[:end].split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise ProtocolError(f"bad status line {lines[0][:80]!r}")
        self.status = int(parts[1])
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            self.headers[name.strip().lower()] = value.strip()
        conn = self.headers.get(b"connection", b"").lower()
        self.keep_alive = conn != b"close" and (parts[0] == b"HTTP/1.1" or conn == b"keep-alive")
        if self.headers.get(b"content-encoding", b"").lower() == b"gzip":
            self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        if b"chunked" in self.headers.get(b"transfer-encoding", b"").lower():
            self._mode = CHUNKED
        elif b"content-length" in self.headers:
            self._left = int(self.headers[b"content-length"])
            self._mode = LENGTH if self._left else DONE
        else:
            self._mode = UNTIL_CLOSE
            self.keep_alive = False
        return buf[end + 4 :]

    def _feed_chunked(self, data: bytes, now_ns: int) -> None:
        if self._pending:
            data = self._pending + data
            self._pending = b""
        pos, n = 0, len(data)
        out: list[bytes] = []
        if self._data_left:  # a chunk begun in an earlier read
            take = min(self._data_left, n)
            out.append(data[:take])
            pos = take
            self._data_left -= take
            if not self._data_left:
                self._crlf_left = 2
        if self._crlf_left and pos < n:
            skip = min(self._crlf_left, n - pos)
            pos += skip
            self._crlf_left -= skip
        find = data.find
        while pos < n and not self._data_left and not self._crlf_left:
            nl = find(b"\r\n", pos)
            if nl < 0:
                self._pending = data[pos:]
                break
            try:
                size = int(data[pos:nl], 16)
            except ValueError:  # chunk extensions
                size = int(data[pos:nl].split(b";", 1)[0], 16)
            if size == 0:
                # Last chunk; no trailers expected: "0\r\n\r\n".
                if find(b"\r\n", nl + 2) < 0:
                    self._pending = data[pos:]
                    break
                self._mode = DONE
                break
            start = nl + 2
            end = start + size
            if end + 2 <= n:  # the usual case: the whole chunk is in this read
                out.append(data[start:end])
                pos = end + 2
                continue
            if start < n:
                out.append(data[start:end])
            if end <= n:
                self._crlf_left = end + 2 - n
            else:
                self._data_left = end - n
            pos = n
        if out:
            self._body(out[0] if len(out) == 1 else b"".join(out), now_ns)

    def _body(self, body: bytes, now_ns: int) -> None:
        self.body_bytes += len(body)  # as received (compressed, for a gzip body)
        if self._inflate is not None:
            body = self._inflate.decompress(body)
        if self.status != 200:
            if len(self.error_body) < MAX_ERROR_BODY:
                self.error_body += body[: MAX_ERROR_BODY - len(self.error_body)]
            return
        if self._sse:
            body = self._sse + body
        if b"\r" in body:
            body = body.replace(b"\r\n", b"\n")
        end = body.rfind(b"\n\n")
        if end < 0:
            self._sse = body
            return
        self._sse = body[end + 2 :]
        self.sink.on_events(now_ns, body[:end].split(b"\n\n"))


class SSEConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; one response at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser: ResponseParser | None = None
        self.rx_bytes = 0
        self.closed = False
        self._done: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, raw: bytes, parser: ResponseParser) -> asyncio.Future[None]:
        """Write a request; the future resolves when its response has ended."""
        assert self.transport is not None
        self.rx_bytes = 0
        if self.closed or self.transport.is_closing():
            raise ConnectionResetError("connection closed by the server")
        try:
            self.transport.write(raw)
        except RuntimeError as exc:  # uvloop: the server closed it before we noticed
            raise ConnectionResetError(str(exc)) from None
        self.parser = parser
        self._done = asyncio.get_running_loop().create_future()
        return self._done

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        self.rx_bytes += len(data)
        parser = self.parser
        if parser is None:
            self.close()  # bytes nobody asked for: do not reuse this connection
            return
        try:
            parser.feed(data, now)
        except (ProtocolError, ValueError) as exc:
            self._finish(ProtocolError(str(exc)))
            self.close()
            return
        if parser.done:
            self._finish(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        parser = self.parser
        if parser is not None:
            parser.eof(time.perf_counter_ns())
            self._finish(None if parser.done else ConnectionResetError("connection closed early"))

    def _finish(self, exc: Exception | None) -> None:
        self.parser = None
        fut, self._done = self._done, None
        if fut is not None and not fut.done():
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class SSEClient:
    """A keep-alive connection pool to one HTTP/1.1 server."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._idle: list[SSEConnection] = []
        self.connects = 0

    async def _connect(self) -> SSEConnection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(SSEConnection, self.host, self.port)
        self.connects += 1
        return conn

    async def exchange(
        self, raw: bytes, sink: EventSink, on_start: Callable[[int], None], timeout: float
    ) -> tuple[ResponseParser, int]:
        """Send one request and read its whole response: (parser, bytes received).

        `on_start` gets the send time. A reused connection that the server had closed
        (no byte of the response arrived) is retried once on a fresh one.
        """
        for attempt in (0, 1):
            reused = attempt == 0 and bool(self._idle)
            conn = self._idle.pop() if reused else await self._connect()
            parser = ResponseParser(sink)
            on_start(time.perf_counter_ns())
            try:
                async with asyncio.timeout(timeout):
                    await conn.send(raw, parser)  # send() raises before the await if closed
            except ConnectionError:
                conn.close()
                if reused and attempt == 0 and conn.rx_bytes == 0:
                    continue
                raise
            except BaseException:
                conn.close()  # timeout, cancellation, protocol error: never reuse
                raise
            if parser.keep_alive and not conn.closed:
                self._idle.append(conn)
            else:
                conn.close()
            return parser, conn.rx_bytes
        raise AssertionError("unreachable")

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
