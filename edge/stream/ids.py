"""Stateless resume: signed event ids and stream capabilities (`ResumeCodec`) under one HMAC,
so any replica with the secret can check one and resume from it (ARCHITECTURE.md, Resume).

    <stream token>.<seq>.<cursor>[~<part>]
    stream token = b64url(form | mac[9] | worker[6] | owner[3] | body[3] | request id)"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import time
from dataclasses import dataclass

from edge.errors import ApiError

MAC_BYTES, WORKER_BYTES, TAG_BYTES = 9, 6, 3
_HEAD = MAC_BYTES + WORKER_BYTES + 2 * TAG_BYTES
_FORM_TEXT, _FORM_HEX = 0, 1
_HEX = re.compile(r"(?:[0-9a-f]{2})+")
_POSITION = re.compile(r"[0-9]{1,18}")
_PART = re.compile(r"[1-9][0-9]{0,2}")  # 1..999
# A stream's very last event (`[DONE]`, `response.completed`): resuming after it is 204.
PART_DONE = 999


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    if not text.isascii():
        raise ValueError("not base64")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class Origin:
    """Whose generation a token names, and where it lives."""

    request_id: str
    worker: str  # worker key
    owner: bytes = b""  # `ResumeCodec.tag` of the principal that started it
    body: bytes = b""  # `ResumeCodec.tag` of the request that started it


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where a client's last received event left off."""

    origin: Origin
    seq: int  # the edge's event counter of that event
    cursor: int  # upstream index to resume from
    part: int = 0  # 0 for token events, else PART_*

    @property
    def request_id(self) -> str:
        return self.origin.request_id

    @property
    def worker(self) -> str:
        return self.origin.worker


def bad_event_id(why: str) -> ApiError:
    return ApiError(
        400, f"invalid Last-Event-ID: {why}", param="Last-Event-ID", code="invalid_last_event_id"
    )


def not_yours() -> ApiError:
    return ApiError(
        403,
        "this stream belongs to another API key",
        type="permission_error",
        param="Last-Event-ID",
        code="stream_not_yours",
    )


class ResumeCodec:
    """Signs and checks event ids and stream capabilities with one secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the resume secret must be at least 16 bytes")
        self._secret = secret

    def _mac(self, purpose: bytes, body: bytes, n: int = MAC_BYTES) -> bytes:
        # hmac.digest: the one-shot C path (no HMAC object per call).
        return hmac.digest(self._secret, purpose + b"|" + body, hashlib.sha256)[:n]

    def tag(self, text: str | bytes) -> bytes:
        """A short keyed digest (of a principal's name, or a request's canonical bytes)."""
        raw = text.encode() if isinstance(text, str) else text
        return self._mac(b"tag", raw, TAG_BYTES)

    def _token(self, purpose: bytes, origin: Origin, extra: bytes = b"") -> str:
        rid = origin.request_id
        if _HEX.fullmatch(rid):
            form, rid_bytes = _FORM_HEX, bytes.fromhex(rid)  # our own hex ids: a 51-char token
        else:
            form, rid_bytes = _FORM_TEXT, rid.encode()
        worker = _unb64(origin.worker)
        if len(worker) != WORKER_BYTES or {len(origin.owner), len(origin.body)} != {TAG_BYTES}:
            raise ValueError("worker key or tags of the wrong size")
        signed = worker + origin.owner + origin.body + rid_bytes
        # `|` ends the variable-length request id, so no byte of it can pass for `extra`.
        mac = self._mac(purpose, bytes((form,)) + signed + b"|" + extra)
        return _b64(bytes((form,)) + mac + signed)

    def _open(self, purpose: bytes, token: str, extra: bytes = b"") -> Origin | None:
        """The origin a token names if its MAC checks out, else None."""
        try:
            raw = _unb64(token)
        except (ValueError, binascii.Error):
            return None
        if len(raw) < 1 + _HEAD or raw[0] not in (_FORM_TEXT, _FORM_HEX):
            return None
        form, mac, signed = raw[0], raw[1 : 1 + MAC_BYTES], raw[1 + MAC_BYTES :]
        if not hmac.compare_digest(mac, self._mac(purpose, bytes((form,)) + signed + b"|" + extra)):
            return None
        w, o = WORKER_BYTES, WORKER_BYTES + TAG_BYTES
        rid_bytes = signed[o + TAG_BYTES :]
        try:
            rid = rid_bytes.hex() if form == _FORM_HEX else rid_bytes.decode()
        except UnicodeDecodeError:
            return None
        return Origin(rid, _b64(signed[:w]), signed[w:o], signed[o : o + TAG_BYTES])

    # -- event ids ----------------------------------------------------------------------

    def prefix(self, origin: Origin) -> bytes:
        """The constant head of a stream's event ids (computed once per stream)."""
        return (self._token(b"event", origin) + ".").encode()

    def parse(self, last_event_id: str) -> ResumePoint:
        """Check and decode a Last-Event-ID; ApiError 400 if it is not one of ours."""
        fields = last_event_id.strip().split(".")
        if len(fields) != 3:
            raise bad_event_id("not an event id of this service")
        token, seq, cursor = fields
        part = 0
        if "~" in cursor:
            cursor, _, part_s = cursor.partition("~")
            if not _PART.fullmatch(part_s):
                raise bad_event_id("malformed position")
            part = int(part_s)
        if not (_POSITION.fullmatch(seq) and _POSITION.fullmatch(cursor)):
            raise bad_event_id("malformed position")
        origin = self._open(b"event", token)
        if origin is None:
            raise bad_event_id("signature mismatch")
        return ResumePoint(origin, int(seq), int(cursor), part)

    # -- stream capabilities ------------------------------------------------------------

    def stream_token(self, origin: Origin, ttl_s: float) -> tuple[str, int]:
        """An unguessable, expiring capability to read one generation; (token, expiry)."""
        expires = int(time.time() + ttl_s)
        return f"{self._token(b'stream', origin, str(expires).encode())}.{expires}", expires

    def open_stream(self, capability: str) -> Origin:
        """The origin of a valid capability; 404 forged, 410 expired."""
        unknown = ApiError(404, "no such stream", code="stream_not_found")
        token, _, expires = capability.partition(".")
        if not (expires.isascii() and expires.isdigit() and len(expires) < 19):
            raise unknown
        origin = self._open(b"stream", token, expires.encode())
        if origin is None:
            raise unknown
        if int(expires) < time.time():
            raise ApiError(410, "this stream link has expired", code="stream_expired")
        return origin
