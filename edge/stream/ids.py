"""Stateless resume: signed SSE event ids and stream capabilities.

An event id names the generation (request id), the worker holding its replay log (its
key: a short hash of the worker's address, `edge.upstream.worker.worker_key`, so
addresses never reach clients), an HMAC over both, and
the position: the edge's event counter and the upstream index to resume from. Any edge
replica with the same secret can check an id and resume from it; a forged or altered id
is refused with 400, never mapped to another stream.

    <b64url(request_id)>.<worker key>.<sig>.<seq>.<cursor>[~<part>]

`part` marks the events after the last token (1 finish, 2 usage, 3 [DONE]): resuming at
one of them replays the final message and sends only the later parts.

A stream capability (`/v1/streams/<token>`, for EventSource, which cannot send an
Authorization header) is the same triple plus an expiry, signed for that purpose.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
from dataclasses import dataclass

from edge.errors import ApiError

SIG_BYTES = 12
_POSITION = re.compile(r"[0-9]{1,18}")
PART_FINISH, PART_USAGE, PART_DONE = 1, 2, 3


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where a client's last received event left off."""

    request_id: str
    worker: str  # worker key
    seq: int  # the edge's event counter of that event
    cursor: int  # upstream index to resume from
    part: int = 0  # 0 for token events, else PART_*


def bad_event_id(why: str) -> ApiError:
    return ApiError(
        400, f"invalid Last-Event-ID: {why}", param="Last-Event-ID", code="invalid_last_event_id"
    )


class ResumeCodec:
    """Signs and checks event ids and stream capabilities with one secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the resume secret must be at least 16 bytes")
        self._secret = secret

    def _sig(self, purpose: bytes, *parts: str) -> str:
        mac = hmac.new(self._secret, purpose + b"|" + "|".join(parts).encode(), hashlib.sha256)
        return _b64(mac.digest()[:SIG_BYTES])

    # -- event ids ----------------------------------------------------------------------

    def prefix(self, request_id: str, worker: str) -> bytes:
        """The constant head of a stream's event ids (computed once per stream)."""
        rid = _b64(request_id.encode())
        return f"{rid}.{worker}.{self._sig(b'event', request_id, worker)}.".encode()

    def parse(self, token: str) -> ResumePoint:
        """Check and decode a Last-Event-ID; ApiError 400 if it is not one of ours."""
        fields = token.strip().split(".")
        if len(fields) != 5:
            raise bad_event_id("not an event id of this service")
        rid_b64, worker, sig, seq, cursor = fields
        part = 0
        if "~" in cursor:
            cursor, _, part_s = cursor.partition("~")
            if part_s not in ("1", "2", "3"):
                raise bad_event_id("malformed position")
            part = int(part_s)
        if not (_POSITION.fullmatch(seq) and _POSITION.fullmatch(cursor)):
            raise bad_event_id("malformed position")
        if not sig.isascii():
            raise bad_event_id("signature mismatch")
        try:
            request_id = _unb64(rid_b64).decode()
        except (ValueError, UnicodeDecodeError):
            raise bad_event_id("malformed stream name") from None
        if not hmac.compare_digest(sig, self._sig(b"event", request_id, worker)):
            raise bad_event_id("signature mismatch")
        return ResumePoint(request_id, worker, int(seq), int(cursor), part)

    # -- stream capabilities ------------------------------------------------------------

    def stream_token(self, request_id: str, worker: str, ttl_s: float) -> tuple[str, int]:
        """An unguessable, expiring capability to read one generation; (token, expiry)."""
        expires = int(time.time() + ttl_s)
        rid = _b64(request_id.encode())
        sig = self._sig(b"stream", request_id, worker, str(expires))
        return f"{rid}.{worker}.{expires}.{sig}", expires

    def open_stream(self, token: str) -> tuple[str, str]:
        """(request id, worker key) of a valid capability; 404 forged, 410 expired."""
        fields = token.split(".")
        unknown = ApiError(404, "no such stream", code="stream_not_found")
        if len(fields) != 4 or not fields[2].isdigit():
            raise unknown
        rid_b64, worker, expires, sig = fields
        if not (sig.isascii() and expires.isascii()):
            raise unknown
        try:
            request_id = _unb64(rid_b64).decode()
        except (ValueError, UnicodeDecodeError):
            raise unknown from None
        if not hmac.compare_digest(sig, self._sig(b"stream", request_id, worker, expires)):
            raise unknown
        if int(expires) < time.time():
            raise ApiError(410, "this stream link has expired", code="stream_expired")
        return request_id, worker
