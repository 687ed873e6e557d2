"""A request's session as HTTP: its key, the signed sticky cookie (`CookieCodec`) and the
headers that say where it went (`edge.routing.pinning` places). A cookie that does not
verify (another secret, a client's own value) is a plain key, pinned like a header."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from http.cookies import SimpleCookie
from urllib.parse import quote

from starlette.requests import Request

from edge.config import SessionConfig
from edge.obs.record import record_of
from edge.routing.pinning import Pinning
from edge.routing.prefix import Prompt
from edge.routing.scores import MAX_KEY_CHARS, SESSION_COOKIE, SESSION_HEADER
from edge.upstream.worker import Worker

POOL_HEADER = b"x-sluice-pool"
MOVED_HEADER = b"x-sluice-session-moved"
_SIG_BYTES = 16


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class CookieCodec:
    """Signs and reads the sticky cookie: `<session id>.<pool, base64url>.<issued, unix
    s>.<HMAC>`, keyed from the resume secret (every replica sharing it honours it). It is
    sent again when the session's pool changed or half its life has passed."""

    def __init__(self, secret: bytes, config: SessionConfig) -> None:
        self._key = hmac.new(secret, b"sluice session cookie v1", hashlib.sha256).digest()
        self.config = config
        self.name = config.cookie or SESSION_COOKIE
        # The attributes never change: formatted once (the stdlib's cookie rules), so each
        # response only joins `name=value` to them. Values need no quoting: base64url
        # characters and dots.
        jar: SimpleCookie = SimpleCookie()
        jar[self.name] = "v"
        morsel = jar[self.name]
        morsel["max-age"] = str(int(config.ttl_s))
        morsel["path"] = config.path
        if config.domain:
            morsel["domain"] = config.domain
        morsel["secure"] = config.secure
        morsel["httponly"] = config.httponly
        morsel["samesite"] = config.samesite.capitalize()
        self._attributes = morsel.OutputString().split(";", 1)[1].encode("latin-1")

    def _sign(self, body: str) -> str:
        mac = hmac.new(self._key, body.encode(), hashlib.sha256).digest()
        return _b64(mac[:_SIG_BYTES])

    def encode(self, sid: str, pool: str, now: float | None = None) -> str:
        issued = int(time.time() if now is None else now)
        body = f"{sid}.{_b64(pool.encode())}.{issued}"
        return f"{body}.{self._sign(body)}"

    def decode(self, value: str, now: float | None = None) -> tuple[str, str, int] | None:
        """(session id, pool, issued) of a cookie this edge signed and still alive, or None."""
        parts = value.split(".")
        if len(parts) != 4 or not (value.isascii() and parts[2].isdigit()):
            return None
        body = ".".join(parts[:3])
        if not hmac.compare_digest(parts[3], self._sign(body)):
            return None
        issued = int(parts[2])
        if (time.time() if now is None else now) - issued >= self.config.ttl_s:
            return None
        try:
            pool = _unb64(parts[1]).decode()
        except ValueError:
            return None
        return parts[0], pool, issued

    def set_cookie(self, value: str) -> bytes:
        """The Set-Cookie header value, with the configured attributes."""
        return b"%s=%s;%s" % (self.name.encode(), value.encode(), self._attributes)


async def place(
    pinning: Pinning,
    codec: CookieCodec,
    request: Request,
    model: str,
    user: str | None,
    prompt: Prompt | None = None,
) -> tuple[Worker, str]:
    """The worker for this request and its session key; the response headers that go with
    the placement are put into the request's record (sent with the response's start).
    `prompt` feeds a cache_aware pool's choice for a request without a session yet."""
    headers = request.headers
    key, pinned, cookie = "", None, None
    given = headers.get(SESSION_HEADER, "").strip()
    raw = request.cookies.get(codec.name, "").strip()
    named = given or (user or "").strip()
    if named:
        key = named[:MAX_KEY_CHARS]
    elif raw and (cookie := codec.decode(raw)) is not None:
        key, pinned = cookie[0], cookie[1]
    elif raw:
        key = raw[:MAX_KEY_CHARS]
    issue = bool(codec.config.cookie) and (cookie is not None or not key)
    placed = await pinning.place(model, key, pinned, prompt)
    out = record_of(request.scope).headers
    out.append((POOL_HEADER, quote(placed.pool).encode()))
    if placed.moved_from:
        moved = f"{quote(placed.moved_from)}; reason={placed.reason}"
        out.append((MOVED_HEADER, moved.encode()))
    stale = cookie is not None and time.time() - cookie[2] > codec.config.ttl_s / 2
    if issue and (placed.new or stale):
        out.append((b"set-cookie", codec.set_cookie(codec.encode(placed.key, placed.pool))))
    return placed.worker, placed.key
