"""Bootstrap: the edge's ASGI stack, wired from the config, and its lifespan: the registry,
session pinning and the background tasks (`Supervisor`), closed in a written order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp

from edge.api import admin, pages
from edge.api.priority import Priorities, key_classes
from edge.api.routes import PAGE_ROUTES, ROUTE_LABELS, Dispatch
from edge.api.state import EdgeState
from edge.config import EdgeConfig
from edge.errors import ApiError
from edge.obs import tracing
from edge.obs.audit import AuditLog
from edge.obs.multiproc import SharedMetrics
from edge.obs.record import ObsMiddleware, Sink
from edge.release import canary
from edge.release.fleet_rollouts import FleetRollouts
from edge.release.rollouts import Rollouts
from edge.release.windows import FleetWindows, LocalWindows, Windows
from edge.routing.adapters import AdapterRouting
from edge.routing.fleet import FleetSync
from edge.routing.pinning import MemoryPins, Pinning, SessionStore
from edge.routing.registry import registry_from_config
from edge.security import tls
from edge.security.auth import AuthMiddleware, KeyStore, load_keys
from edge.security.budgets import Budgets, budgets_of
from edge.security.cors import cors_middleware
from edge.security.limits import Limits, LimitsMiddleware
from edge.security.usage import Meter
from edge.store.base import Store
from edge.store.connection import cancel_and_wait
from edge.store.control import Control
from edge.store.guarded import Guarded
from edge.store.memory import MemoryStore
from edge.store.pins import StorePins
from edge.store.redis import RedisStore
from edge.store.rollouts import RolloutBoard
from edge.store.usage import Ledger, MemoryLedger, RedisLedger
from edge.store.windows import WindowCounters
from edge.upstream.channel import ChannelFactory, channel_options
from edge.upstream.worker import first_word

log = logging.getLogger("sluice.edge")
# How long a process waits at startup to hear from its workers before it accepts requests.
FIRST_WORD_S = 2.0
STOP_GRACE_S = 5.0  # how long a background task may take to stop, each time it is asked


class Supervisor:
    """The edge's background tasks. One that crashes is logged and the others go on;
    `stop` cancels them last started first, each awaited before the next, so a policy
    (rollouts, canary) stops before the windows and fleet state it reads."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(_report)
        self._tasks.append(task)

    async def stop(self) -> None:
        while self._tasks:
            task = self._tasks.pop()
            # A crash is logged already; a lost cancel (a Redis call) is asked again.
            if not await cancel_and_wait(task, STOP_GRACE_S):
                log.warning("background task %r did not stop", task.get_name())


def _report(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("background task %r crashed", task.get_name(), exc_info=exc)


SESSION_LOOKAHEAD_BYTES = 4 << 20


def channels(config: EdgeConfig) -> ChannelFactory:
    """How this process opens worker channels (TLS when configured)."""
    window = config.stream.stream_buffer_bytes
    # A session's HTTP/2 window is shared by its generations, each bounded in-band.
    lookahead = (
        max(window, SESSION_LOOKAHEAD_BYTES) if config.routing.upstream == "session" else window
    )
    return ChannelFactory(
        channel_options(config.routing.keepalive_s, config.routing.keepalive_timeout_s, lookahead),
        tls.credentials(config.worker_tls),
        config.worker_tls.server_name,
        stream_window_bytes=window,
    )


def shared_store(config: EdgeConfig) -> Guarded | None:
    """The shared store of limits and pins (`--store-url`), with its failure mode; None:
    this process keeps its own."""
    s = config.store
    if not s.url:
        return None
    local = MemoryStore(
        config.session.ttl_s, config.session.store_max, max_doc_bytes=s.local_max_bytes
    )
    return Guarded(RedisStore(s.url, s.timeout_s, s.prefix), local, s.failure == "open")


def create_app(config: EdgeConfig, state: EdgeState | None = None) -> ASGIApp:
    """The edge as an ASGI app. Channels to workers open at startup, close at shutdown
    (after uvicorn has drained the in-flight streams)."""
    state = state or EdgeState(config)
    factory = channels(config)
    tracing.setup(config.server.otlp_endpoint)  # off unless an OTLP endpoint is set
    shared = shared_store(config)
    limits_store: Store = shared or MemoryStore(
        config.session.ttl_s, 1, max_doc_bytes=config.store.local_max_bytes
    )
    state.store = limits_store  # stored responses too
    s = config.store
    ledger: Ledger = RedisLedger(s.url, s.timeout_s, s.prefix) if s.url else MemoryLedger()
    state.ledger = ledger
    meter = Meter(ledger)
    state.usage = meter.record
    audit = audit_log(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        registry = state.registry = registry_from_config(config.routing, factory)
        pins: SessionStore = (
            StorePins(shared, config.session.ttl_s)
            if shared is not None
            else MemoryPins(config.session.ttl_s, config.session.store_max)
        )
        pinning = state.pinning = Pinning(registry, pins)
        state.adapters = AdapterRouting(registry, config.routing)
        registry.start()
        await first_word(registry.workers, FIRST_WORD_S)  # uvicorn accepts after this
        tasks = Supervisor()
        if config.server.metrics_dir:
            merged = SharedMetrics(config.server.metrics_dir, lambda: pages.render_metrics(state))
            state.shared_metrics = merged
            tasks.start(merged.run(), "metrics writer")
        control = counters = board = None
        windows: Windows = LocalWindows(registry)
        rollouts: Rollouts | FleetRollouts = Rollouts(registry)
        if config.store.url:  # admin changes, rollbacks, rollouts: every process and replica
            s = config.store
            control = Control(s.url, s.timeout_s, s.prefix)
            fleet = state.fleet = FleetSync(registry, control)
            tasks.start(fleet.watch(), "fleet watch")
            counters = WindowCounters(s.url, s.timeout_s, s.prefix)  # canary windows summed
            shared_windows = FleetWindows(
                registry, counters, lambda: max(canary.span(registry), rollouts.span())
            )
            windows = state.windows = shared_windows
            tasks.start(shared_windows.run(), "fleet windows")
            board = RolloutBoard(s.url, s.timeout_s, s.prefix)
            rollouts = FleetRollouts(registry, board, fleet, windows)
        state.rollouts = rollouts
        state.metrics.extra = [
            registry.render_metrics,
            pinning.render_metrics,
            rollouts.render_metrics,
            meter.render_metrics,
            *([shared.render_metrics] if shared is not None else []),
            *([audit.render_metrics] if audit is not None else []),
        ]
        tasks.start(meter.run(), "usage meter")
        if shared is not None:
            tasks.start(shared.run(), "store presence")
        tasks.start(canary.watch(registry, windows, state.fleet), "canary watch")
        tasks.start(rollouts.watch(), "rollouts watch")
        try:
            yield
        finally:  # after uvicorn drained the streams; each step after the one before
            await state.background.close(state.store)  # their generations run on: handed over
            await tasks.stop()  # usage, rollouts, canary, fleet windows and watch, metrics
            await meter.flush()  # the last generations' usage (the streams are over)
            if audit is not None:
                await asyncio.to_thread(audit.close)  # its last lines written
            await registry.close()  # its workers' watches and channels
            tracing.shutdown()  # flushes the last spans
            await limits_store.close()
            await ledger.close()
            if control is not None:
                await control.close()
            if counters is not None:
                await counters.close()
            if board is not None:
                await board.close()

    admin_key = config.routing.admin_key
    rest = Starlette(
        routes=[*PAGE_ROUTES, *(admin.ROUTES if admin_key else [])],
        exception_handlers={
            ApiError: pages.on_api_error,
            HTTPException: pages.on_http_error,
            Exception: pages.on_unexpected,
        },
        lifespan=lifespan,
    )
    rest.state.edge = state
    budgets = Budgets(budgets_of(config.security.key_budgets), ledger, s.failure == "open")
    sinks: list[Sink] = [lambda scope, rec, took: meter.record(rec)]
    if audit is not None:
        sinks.append(audit.submit)
    app = Dispatch(state, rest)
    return secured(app, config, state, limits_store, budgets=budgets, sinks=sinks)


def audit_log(config: EdgeConfig) -> AuditLog | None:
    """The audit log's writer (`--audit-log`), None when it is off."""
    a = config.audit
    if not a.path:
        return None
    return AuditLog(
        a.path,
        bodies=a.bodies,
        redact=a.redact,
        max_bytes=a.max_bytes,
        backups=a.backups,
        queue_size=a.queue,
    )


def secured(
    app: ASGIApp,
    config: EdgeConfig,
    state: EdgeState,
    store: Store,
    *,
    budgets: Budgets | None = None,
    sinks: list[Sink] | None = None,
) -> ASGIApp:
    """`app` inside, outermost first: observation (the one send wrapper) -> CORS ->
    authentication -> limits (budgets first), so a 401 or 429 is counted, logged and
    carries CORS headers; the sinks (usage, audit) get every request's record at its end."""
    sec = config.security
    keys = KeyStore(load_keys(sec.api_keys_file))
    admin_key = config.routing.admin_key
    if not keys:
        log.warning("no API keys configured (--api-keys-file, $SLUICE_API_KEYS): auth is OFF")
    elif not admin_key:
        log.warning("no admin key ($SLUICE_ADMIN_KEY): /metrics and /admin are refused")
    metrics = state.metrics
    tenants = dict(entry.partition("=")[::2] for entry in sec.key_tenants)
    state.priorities = Priorities(key_classes(sec.key_priorities), bool(keys), tenants)
    named = {*state.priorities.keys, *tenants, *(budgets.budgets if budgets else {})} - {"*"}
    unknown = sorted(named - keys.names())
    if unknown:
        log.warning("--key-priority/-tenant/-budget name no configured key: %s", ", ".join(unknown))
    limits = Limits(
        sec.rate_limit_rps, sec.rate_limit_burst, sec.max_streams_per_key, sec.tpm_limit
    )
    app = LimitsMiddleware(app, limits, store, metrics.admission_rejections, budgets)
    app = AuthMiddleware(app, keys, admin_key, metrics.auth_failures, tenants)
    if sec.cors_origins:
        app = cors_middleware(app, sec.cors_origins)
    access_log = config.server.log_format == "json"
    bodies = bool(config.audit.path and config.audit.bodies)
    return ObsMiddleware(app, metrics, ROUTE_LABELS, access_log, sinks or (), bodies)


def app_from_env() -> ASGIApp:
    """Factory for uvicorn worker processes (`--processes N`): config from the environment."""
    return create_app(EdgeConfig.from_env())
