"""One record per HTTP request (`RequestRecord`, in the scope under `RECORD`, filled by the
inner layers) and the one `send` wrapper (`ObsMiddleware`, outermost): status and extra
headers at the start, bytes, `on_complete` as the last byte goes out, the access record.
Routes with parameters count under their template: capabilities never become labels.
Sinks (usage accounting, the audit log) get each record once the request is over."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edge.obs import tracing
from edge.obs.logs import access_log, access_record
from edge.obs.metrics import Metrics

RECORD = "sluice.record"
MAX_AUDIT_RESPONSE_BYTES = 1 << 20  # of a response kept for the audit log, at most
Sink = Callable[[Scope, "RequestRecord", float], None]  # (scope, record, seconds it took)


@dataclass(slots=True)
class RequestRecord:
    """What is known about one HTTP request (see the module docstring)."""

    route: str
    caller: str | None = None  # the API key's name (security sets it)
    tenant: str = ""  # the key's tenant (security sets it)
    model: str = ""  # the model a generation asked for (or its worker's)
    worker: str = ""  # the worker that held the generation at its end
    # The generation's original request id, set when its final's usage is noted (resumes
    # and continuations share it): what usage accounting counts once.
    generation: str = ""
    request_id: str = ""
    trace_id: str = ""
    status: int = 0
    bytes_sent: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish: str | None = None
    # With `--audit-bodies` (`bodies` set by `ObsMiddleware`), for API calls (a caller):
    # the request's body as the handler read it, the response's bytes as they went out
    # (up to a cap). Not /metrics, /admin or the public pages.
    bodies: bool = False
    request_body: bytes | None = None
    response_body: list[bytes] | None = None
    on_complete: list[Callable[[], None]] = field(default_factory=list)
    # Set by the limits while a stream slot is held: keeps the slot past this request
    # and returns its release (a detached generation holds it).
    keep_slot: Callable[[], Callable[[], None]] | None = None
    # Set by the limits when a tokens-per-minute limit applies: reserves a generation's
    # most tokens (raises the 429) and settles them with its usage at the end.
    reserve: Callable[[int], Awaitable[None]] | None = None
    # Added to the response's headers as it starts, whatever response it is (the session
    # cookie and the pool a generation went to: `edge.api.affinity`).
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    # The server's own `send`, under this wrapper (None with bodies kept): a stream's
    # token events may be written with it, counting their bytes here (`edge.stream.wire`).
    raw_send: Send | None = None

    def complete(self) -> None:
        """Run (once) what waits for the response's end."""
        callbacks, self.on_complete = self.on_complete, []
        for cb in callbacks:
            cb()


def record_of(scope: Scope) -> RequestRecord:
    """The scope's record (a blank one outside `ObsMiddleware`, e.g. in unit tests)."""
    rec = scope.get(RECORD)
    if rec is None:
        rec = scope[RECORD] = RequestRecord(route=scope.get("path", "other"))
    return rec  # type: ignore[no-any-return]


class RouteLabels:
    """Paths -> route labels: exact paths, templates, else "other"."""

    def __init__(self, routes: Iterable[str]) -> None:
        routes = list(routes)
        self.exact = frozenset(r for r in routes if "{" not in r)
        self.templates = [(compile_path(r)[0], r) for r in sorted(set(routes)) if "{" in r]

    def __call__(self, path: str) -> str:
        if path in self.exact:
            return path
        for regex, template in self.templates:
            if regex.match(path):
                return template
        return "other"


class ObsMiddleware:
    """See the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        metrics: Metrics,
        routes: Iterable[str],
        access_log: bool,
        sinks: Sequence[Sink] = (),
        bodies: bool = False,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.route = RouteLabels(routes)
        self.access_log = access_log
        self.sinks = tuple(sinks)
        self.bodies = bodies  # keep bodies in the record for a sink (the audit log)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rec = scope[RECORD] = RequestRecord(route=self.route(scope["path"]))
        if self.bodies:
            rec.bodies, rec.response_body = True, []
        else:
            rec.raw_send = send
        span = tracing.start_request(scope, rec.route)  # None unless tracing is on
        requests = self.metrics.requests
        t0 = time.perf_counter()

        async def observed_send(message: Message) -> None:
            if message["type"] == "http.response.body":
                body = message.get("body", b"")
                kept = rec.response_body
                if kept is not None and rec.caller and rec.bytes_sent < MAX_AUDIT_RESPONSE_BYTES:
                    kept.append(body)
                rec.bytes_sent += len(body)
                if not message.get("more_body", False):
                    rec.complete()
            elif message["type"] == "http.response.start":
                rec.status = message["status"]
                requests[(rec.route, rec.status)] += 1
                if rec.headers:
                    message = {**message, "headers": [*message.get("headers", ()), *rec.headers]}
            await send(message)

        try:
            await self.app(scope, receive, observed_send)
        finally:
            rec.complete()
            if span is not None:
                tracing.end_request(span, rec.status, rec.route, rec.request_id)
            took = time.perf_counter() - t0
            if self.access_log:
                fields = access_record(scope, rec, took)
                access_log.info("%s %s %d", scope["method"], rec.route, rec.status, extra=fields)
            for sink in self.sinks:
                sink(scope, rec, took)
            # The server's request object holds the scope, which holds the record: without
            # this link back the two go with their last reference, not in a collection
            # (with 20,000 streams open, a collection of their remains held the loop ~0.7 s).
            rec.raw_send = None
