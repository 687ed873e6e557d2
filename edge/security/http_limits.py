"""The edge's uvicorn (httptools) protocol. Bounds on request heads, which uvicorn has none
of: over `--max-header-bytes` or `--max-headers` 431, not complete within `--header-timeout`
408 (the client's time, not a stalled loop's: `_too_slow`), the connection closed, as
nginx's `large_client_header_buffers` and `client_header_timeout`. Each request's `Cork`
(`edge.security.cork`), whose bytes go out before the protocol's own writes and closes."""

from __future__ import annotations

import asyncio
import fcntl
import struct
import termios
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from edge.config import ServerConfig
from edge.security.cork import Cork

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class LimitedConfig(uvicorn.Config):
    """uvicorn's config carrying the head limits to every protocol instance (a class at
    module level: `--processes N` pickles the config into each process)."""

    def __init__(self, app: Any, server: ServerConfig, **kwargs: Any) -> None:
        super().__init__(app, http=LimitedHttpToolsProtocol, **kwargs)
        self.head_limits = (server.max_header_bytes, server.max_headers, server.header_timeout_s)


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """See the module docstring; the limits come from `LimitedConfig`."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        limits: tuple[int, int, float] = getattr(config, "head_limits", (32 * 1024, 100, 10.0))
        self.max_head_bytes, self.max_headers, self.head_timeout_s = limits

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.held: Cork | None = None  # a cycle's cork holding bytes (it sets this)
        self._refused = False
        self._began = False  # a head began within the read being parsed
        self._head_timer: asyncio.TimerHandle | None = None
        self._start_head()

    def _start_head(self) -> None:
        self._heading = True
        self._head_bytes = 0  # raw bytes of a head still incomplete after a read
        self._head_size = 0  # of the parsed request line and header fields
        self._head_count = 0
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._too_slow)

    def _end_head(self) -> None:
        self._heading = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _write_held(self) -> None:
        """A cork's bytes out before whatever this protocol writes or closes next."""
        if self.held is not None:
            self.held.release()

    def connection_lost(self, exc: Exception | None) -> None:
        self.held = None  # the client left: nothing more goes out
        self._end_head()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        self._write_held()
        super().shutdown()

    def timeout_keep_alive_handler(self) -> None:
        self._write_held()
        super().timeout_keep_alive_handler()

    def data_received(self, data: bytes) -> None:
        self._write_held()  # (a malformed next request is answered 400 and closed)
        if self._refused:
            return
        self._began = False
        super().data_received(data)
        # Still in the head after all of it: every byte was head (a head that never ends
        # is bounded here, one read past the limit at most), unless this head began
        # within this read (a pipelined request after a body): then what was parsed of it.
        if self._heading and not self._refused:
            self._head_bytes = self._head_size if self._began else self._head_bytes + len(data)
            if self._head_bytes > self.max_head_bytes:
                self._refuse(431, "request header fields too large")

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        super().on_url(url)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._heading:
            self._start_head()
            self._began = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused:
            return
        self._head_count += 1
        self._head_size += len(name) + len(value) + 4
        if self._head_count > self.max_headers:
            self._refuse(431, "too many request header fields")
            return
        if self._head_size > self.max_head_bytes:
            self._refuse(431, "request header fields too large")
            return
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._end_head()
        before = self.cycle
        super().on_headers_complete()
        if (cycle := self.cycle) is not before and cycle is not None:  # a request's cycle
            cycle.transport = Cork(cycle, self.transport, self.loop, self)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        super().on_message_complete()
        # A keep-alive connection's next head starts with its first byte (on_message_begin);
        # until then uvicorn's own keep-alive timeout bounds the idle time.

    def _too_slow(self) -> None:
        """The head's time is up, unless the socket holds bytes this process has not read
        yet: then the client did send and the loop is behind (as when thousands of
        connections arrive at once); the timer starts again rather than answering 408
        and closing a socket with the request unread in it (a reset)."""
        self._head_timer = None
        if not self._heading or self._refused:
            return
        if self._unread_bytes():  # the loop is behind, not the client
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._too_slow)
            return
        self._refuse(408, "request header not received in time")

    def _unread_bytes(self) -> int:
        """Bytes waiting in the socket's receive buffer (0 if that cannot be known)."""
        sock = self.transport.get_extra_info("socket")
        try:
            raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except (AttributeError, OSError, ValueError):
            return 0
        return int(struct.unpack("i", raw)[0])

    def _refuse(self, status: int, message: str) -> None:
        """Answer with `status` and close: the request never reaches the app."""
        self._write_held()
        self._refused = True
        self._end_head()
        body = (
            b'{"error":{"message":"%s","type":"invalid_request_error","param":null,'
            % (message.encode())
            + b'"code":"http_%d"}}' % status
        )
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n" % (status, _REASONS[status])
        head += b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        if not self.transport.is_closing():
            self.transport.write(head + body)
            self.transport.close()
