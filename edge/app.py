"""Bootstrap: the edge's ASGI stack, wired from the config, and the lifespan of its
worker registry and background policies.

Outermost first: observation (the one send wrapper: metrics, access log, on-complete
callbacks) -> CORS -> authentication -> limits -> the dispatcher (generation routes
straight to their handlers, the rest through Starlette). A 401 or 429 is therefore
counted and logged, and carries CORS headers for browsers.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp

from edge.api import admin, pages
from edge.api.routes import PAGE_ROUTES, ROUTE_LABELS, Dispatch
from edge.api.state import EdgeState
from edge.config import EdgeConfig
from edge.errors import ApiError
from edge.obs.record import ObsMiddleware
from edge.security import tls
from edge.security.auth import AuthMiddleware, KeyStore, load_keys
from edge.security.cors import cors_middleware
from edge.security.limits import LimitsMiddleware
from edge.upstream import canary
from edge.upstream.channel import ChannelFactory, channel_options
from edge.upstream.registry import registry_from_config
from edge.upstream.rollouts import Rollouts
from edge.upstream.sessions import MemoryStore, Pinning

log = logging.getLogger("sluice.edge")


def channels(config: EdgeConfig) -> ChannelFactory:
    """How this process opens worker channels (TLS when configured)."""
    return ChannelFactory(
        channel_options(
            config.routing.keepalive_s,
            config.routing.keepalive_timeout_s,
            config.stream.stream_buffer_bytes,
        ),
        tls.credentials(config.worker_tls),
        config.worker_tls.server_name,
    )


def create_app(config: EdgeConfig, state: EdgeState | None = None) -> ASGIApp:
    """The edge as an ASGI app. Channels to workers open at startup, close at shutdown
    (after uvicorn has drained the in-flight streams)."""
    state = state or EdgeState(config)
    factory = channels(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        registry = state.registry = registry_from_config(config.routing, factory)
        store = MemoryStore(config.session.ttl_s, config.session.store_max)
        pinning = state.pinning = Pinning(registry, store)
        rollouts = state.rollouts = Rollouts(registry)
        state.metrics.extra = [
            registry.render_metrics,
            pinning.render_metrics,
            rollouts.render_metrics,
        ]
        registry.start()
        registry.spawn(canary.watch(registry), "canary watch")
        registry.spawn(rollouts.watch(), "rollouts watch")
        try:
            yield
        finally:
            await registry.close()

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
    return secured(Dispatch(state, rest), config, state)


def secured(app: ASGIApp, config: EdgeConfig, state: EdgeState) -> ASGIApp:
    """`app` inside limits, authentication, CORS and observation (the module docstring)."""
    sec = config.security
    keys = KeyStore(load_keys(sec.api_keys_file))
    admin_key = config.routing.admin_key
    if not keys:
        log.warning("no API keys configured (--api-keys-file, $SLUICE_API_KEYS): auth is OFF")
    elif not admin_key:
        log.warning("no admin key ($SLUICE_ADMIN_KEY): /metrics and /admin are refused")
    metrics = state.metrics
    app = LimitsMiddleware(
        app,
        sec.rate_limit_rps,
        sec.rate_limit_burst,
        sec.max_streams_per_key,
        metrics.admission_rejections,
    )
    app = AuthMiddleware(app, keys, admin_key, metrics.auth_failures)
    if sec.cors_origins:
        app = cors_middleware(app, sec.cors_origins)
    access_log = config.server.log_format == "json"
    return ObsMiddleware(app, metrics, ROUTE_LABELS, access_log)


def app_from_env() -> ASGIApp:
    """Factory for uvicorn worker processes (`--processes N`): config from the environment."""
    return create_app(EdgeConfig.from_env())
