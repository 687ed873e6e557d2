"""Per-key limits at the edge: requests per second, concurrent generations, prompt size.

- Rate: a token bucket per caller (`--rate-limit` per second, `--rate-burst` deep) over
  every request that needs an API key. Past it: 429 `rate_limit_exceeded` with
  Retry-After (when the bucket holds a token again).
- Concurrency: at most `--max-streams-per-key` generations (`/v1/chat/completions`,
  `/v1/completions`, streamed or not, and browser streams: `POST /v1/streams` keeps its
  slot while its detached generation may still run, see `edge.api.detached`) in flight
  per caller. Past it: 429
  `concurrency_limit_exceeded`. A slot is held until the response's last byte is sent
  (the record's `on_complete`, run by `edge.obs.record`'s send wrapper) or the request's
  ASGI call returns, whichever comes first: the stream ended, or the client went away
  (the response notices a disconnect at once and returns).

The prompt's size (`--max-prompt-chars`) is checked with the request's other fields
(`edge.api`); the body itself is bounded by `--max-body-bytes` (413).

The caller is the API key's name (set by `edge.security.auth` in the request's record);
with authentication off, every request is the one caller "anonymous", so the limits
become edge-wide. State is per edge
process: with `--processes N` (or N replicas) a key gets up to N times the limits.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from edge.errors import ApiError, error_response
from edge.obs.record import record_of

GENERATION_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/streams"}
)
CONCURRENCY_RETRY_S = 1.0  # no way to know when a stream ends: a plain hint


@dataclass(slots=True)
class TokenBucket:
    """`rate` tokens a second, at most `burst` stored; one token per request."""

    rate: float
    burst: float
    tokens: float = -1.0  # -1: full on first use
    stamp: float = 0.0

    def take(self, now: float) -> float:
        """0 if a token was taken, else seconds until one is there."""
        if self.tokens < 0:
            self.tokens = self.burst
        else:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


def rate_limited(wait_s: float) -> ApiError:
    return ApiError(
        429,
        "Rate limit reached for this API key; retry after the Retry-After delay.",
        type="rate_limit_error",
        code="rate_limit_exceeded",
        retryable=True,
        retry_after_s=max(wait_s, 0.001),
    )


def too_many_streams(limit: int) -> ApiError:
    return ApiError(
        429,
        f"This API key already has {limit} generations in flight (the most allowed); "
        "retry once one has finished.",
        type="rate_limit_error",
        code="concurrency_limit_exceeded",
        retryable=True,
        retry_after_s=CONCURRENCY_RETRY_S,
    )


class LimitsMiddleware:
    """Rate and concurrency limits for requests that carry a caller (see module doc)."""

    def __init__(
        self,
        app: ASGIApp,
        rate: float,
        burst: int,
        max_streams: int,
        rejections: dict[str, int],
    ) -> None:
        self.app = app
        self.rate = rate
        self.burst = float(burst or max(1, math.ceil(rate)))
        self.max_streams = max_streams
        self.rejections = rejections  # Metrics.admission_rejections: counted by reason
        self.buckets: dict[str, TokenBucket] = {}
        self.streams: defaultdict[str, int] = defaultdict(int)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rec = record_of(scope) if scope["type"] == "http" else None
        caller = rec.caller if rec is not None else None
        if rec is None or caller is None:
            await self.app(scope, receive, send)
            return
        if self.rate > 0:
            bucket = self.buckets.get(caller)
            if bucket is None:
                bucket = self.buckets[caller] = TokenBucket(self.rate, self.burst)
            wait = bucket.take(time.monotonic())
            if wait > 0:
                self.rejections["rate_limit"] += 1
                await error_response(rate_limited(wait))(scope, receive, send)
                return
        if not (self.max_streams and scope["path"] in GENERATION_PATHS):
            await self.app(scope, receive, send)
            return
        if self.streams[caller] >= self.max_streams:
            self.rejections["concurrency"] += 1
            await error_response(too_many_streams(self.max_streams))(scope, receive, send)
            return
        self.streams[caller] += 1
        held = True
        kept = False

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self.streams[caller] -= 1
                if not self.streams[caller]:
                    del self.streams[caller]

        def release_now() -> None:
            if not kept:
                release()

        def keep() -> Callable[[], None]:
            """The slot outlives this request (a detached generation holds it): the
            caller releases it with what this returns."""
            nonlocal kept
            kept = True
            return release

        # Free the slot as the last byte goes out, not when the app returns (it may still
        # wait for the RPC's status): a client that reads the end and sends its next
        # request at once must find the slot free.
        rec.on_complete.append(release_now)
        rec.keep_slot = keep
        try:
            await self.app(scope, receive, send)
        finally:
            release_now()
