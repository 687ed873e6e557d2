"""Per-key limits, kept in the store so that they hold for the fleet: requests per second (a
token bucket), concurrent generations (a lease until the last byte or the ASGI call's
end), tokens per minute (reserved once the body is parsed, settled at the end); a key's budget
(`budgets.py`) before them. The caller is the API key's name ("anonymous" with
authentication off: edge-wide limits)."""

from __future__ import annotations

import asyncio
import math
import secrets
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from edge.errors import ApiError, error_response
from edge.obs.record import RequestRecord, record_of
from edge.security.budgets import Budgets
from edge.store.base import Store, StoreUnavailable
from edge.store.memory import TokenBucket

__all__ = ["LimitsMiddleware", "TokenBucket", "rate_limited"]

GENERATION_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/v1/streams",
        "/v1/embeddings",  # counted as a generation: a slot, its tokens, the budget
    }
)
CONCURRENCY_RETRY_S = 1.0  # no way to know when a stream ends: a plain hint
# A stream slot's lease in the store lapses this long after its holder stops renewing
# it (the store renews it every third of that while the stream runs).
LEASE_TTL_S = 30.0


@dataclass(slots=True)
class Limits:
    """The per-key limits (0: off). `max_streams` counts generations (chat, completions,
    responses, messages, streamed or not; a browser stream's `POST /v1/streams` holds its
    slot while its detached generation may run). A generation whose usage is unknown at its end (the
    client left, a detached stream) keeps its `tpm` reservation."""

    rate: float = 0.0
    burst: int = 0
    max_streams: int = 0
    tpm: int = 0


def rate_limited(wait_s: float) -> ApiError:
    return ApiError(
        429,
        "Rate limit reached for this API key; retry after the Retry-After delay.",
        type="rate_limit_error",
        code="rate_limit_exceeded",
        retryable=True,
        retry_after_s=max(wait_s, 0.001),
    )


def tokens_limited(wait_s: float, limit: int) -> ApiError:
    return ApiError(
        429,
        f"Tokens per minute limit ({limit}) reached for this API key; retry after the "
        "Retry-After delay, or ask for fewer max_tokens.",
        type="tokens",
        code="tokens_limit_exceeded",
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


def store_down(exc: StoreUnavailable) -> ApiError:
    return ApiError(
        503,
        "The edge cannot check this key's limits now (its shared store is unavailable); "
        "retry after the Retry-After delay.",
        type="server_error",
        code="limits_unavailable",
        retryable=True,
        retry_after_s=max(exc.retry_after_s, 0.001),
    )


class LimitsMiddleware:
    """Rate, concurrency and token limits for requests that carry a caller (module doc)."""

    def __init__(
        self,
        app: ASGIApp,
        limits: Limits,
        store: Store,
        rejections: dict[str, int],
        budgets: Budgets | None = None,
    ) -> None:
        self.app = app
        self.limits = limits
        self.store = store
        self.budgets = budgets or None  # None when no key has a budget
        self.rate = limits.rate
        self.burst = float(limits.burst or max(1, math.ceil(limits.rate)))
        self.rejections = rejections  # Metrics.admission_rejections: counted by reason
        self._tasks: set[asyncio.Task[object]] = set()  # releases and settlements under way

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rec = record_of(scope) if scope["type"] == "http" else None
        caller = rec.caller if rec is not None else None
        if rec is None or caller is None:
            await self.app(scope, receive, send)
            return
        generation = scope["path"] in GENERATION_PATHS
        lease = secrets.token_hex(8) if self.limits.max_streams and generation else ""
        try:
            # A key past its budget is refused before it spends a rate token or a slot.
            refusal = await self.budgets.check(caller) if self.budgets and generation else None
            if refusal is not None:
                self.rejections["budget"] += 1
            else:
                refusal = await self._admit(caller, lease)
        except StoreUnavailable as exc:
            self.rejections["store_unavailable"] += 1
            refusal = store_down(exc)
        if refusal is not None:
            await error_response(refusal)(scope, receive, send)
            return
        tpm = bool(self.limits.tpm and generation)
        if not lease and not tpm:
            await self.app(scope, receive, send)
            return
        end = _End(self, rec, caller, lease)
        if tpm:
            rec.reserve = end.reserve
        if lease:
            rec.keep_slot = end.keep
        # Free the slot as the last byte goes out, not when the app returns (it may still
        # wait for the RPC's status): a client that reads the end and sends its next
        # request at once must find the slot free.
        rec.on_complete.append(end)
        try:
            await self.app(scope, receive, send)
        finally:
            end.release_now()

    async def _admit(self, caller: str, lease: str) -> ApiError | None:
        """Take the request's rate token and, for a generation, its stream slot (one
        store call when both limits are on, none when neither is); the refusal, if any.
        A refused slot keeps the token spent: the rate counts every request."""
        wait, held = 0.0, True
        limit = self.limits.max_streams
        rate_key, slots = f"rate:{caller}", f"streams:{caller}"
        if self.rate > 0 and lease:
            wait, held = await self.store.admit(
                rate_key, self.rate, self.burst, slots, lease, limit, LEASE_TTL_S
            )
        elif self.rate > 0:
            wait = await self.store.take(rate_key, self.rate, self.burst)
        elif lease:
            held = await self.store.acquire(slots, lease, limit, LEASE_TTL_S)
        if wait > 0:
            self.rejections["rate_limit"] += 1
            return rate_limited(wait)
        if not held:
            self.rejections["concurrency"] += 1
            return too_many_streams(limit)
        return None

    def spawn(self, op: Coroutine[Any, Any, object]) -> None:
        task = asyncio.get_running_loop().create_task(op)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # a failed release lapses by its ttl; settlements are best effort


class _End:
    """What a generation gives back: its stream slot (`lease`, unless a detached
    generation keeps it) and the difference between its tokens' reservation and its
    usage. Called when the response ends (`rec.on_complete`), with one store call for
    both when both apply."""

    __slots__ = ("caller", "kept", "lease", "limits", "rec", "reserved")

    def __init__(
        self, limits: LimitsMiddleware, rec: RequestRecord, caller: str, lease: str
    ) -> None:
        self.limits = limits
        self.rec = rec
        self.caller = caller
        self.lease = lease  # "" once released (or when there is no slot)
        self.kept = False
        self.reserved = 0.0  # tokens reserved (0: none)

    async def reserve(self, tokens: int) -> None:
        """What `edge.api` calls with a generation's most tokens, once it is parsed."""
        tpm = self.limits.limits.tpm
        cost = float(min(tokens, tpm))  # more than a minute's worth: one full bucket
        try:
            wait = await self.limits.store.take(f"tpm:{self.caller}", tpm / 60.0, tpm, cost)
        except StoreUnavailable as exc:
            self.limits.rejections["store_unavailable"] += 1
            raise store_down(exc) from None
        if wait > 0:
            self.limits.rejections["tokens"] += 1
            raise tokens_limited(wait, tpm)
        self.reserved = cost

    def settlement(self) -> float:
        """Tokens to take (negative: give back) at the end; 0: nothing to settle."""
        rec = self.rec
        if not self.reserved:
            return 0.0
        if rec.completion_tokens is not None:
            used = (rec.prompt_tokens or 0) + rec.completion_tokens
        elif rec.status >= 400:
            used = 0  # refused or failed before generating: all back
        else:
            return 0.0  # unknown (left mid-stream, detached): the reservation stands
        return used - self.reserved

    def __call__(self) -> None:
        owed = self.settlement()
        self.reserved = 0.0  # settled once
        lease = "" if self.kept else self.lease
        tpm = self.limits.limits.tpm
        store, spawn = self.limits.store, self.limits.spawn
        if lease and owed:
            self.lease = ""
            slots, bucket = f"streams:{self.caller}", f"tpm:{self.caller}"
            spawn(store.finish(slots, lease, bucket, tpm / 60.0, tpm, owed))
        elif owed:
            spawn(store.take(f"tpm:{self.caller}", tpm / 60.0, tpm, owed, force=True))
        else:
            self.release_now()

    def release(self) -> None:
        if self.lease:
            lease, self.lease = self.lease, ""
            self.limits.spawn(self.limits.store.release(f"streams:{self.caller}", lease))

    def release_now(self) -> None:
        """The slot's release unless a detached generation kept it."""
        if not self.kept:
            self.release()

    def keep(self) -> Callable[[], None]:
        """The slot outlives this request (a detached generation holds it): the caller
        releases it with what this returns."""
        self.kept = True
        return self.release
