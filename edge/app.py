"""The Starlette application: routes, error handlers, metrics, and the worker set's life."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import Route

from edge import admin, handlers
from edge.config import EdgeConfig
from edge.errors import ApiError
from edge.handlers import EdgeState
from edge.metrics import ASGIApp, MetricsMiddleware
from edge.pools import registry_from_config
from edge.security import install as install_security

ROUTES = (
    Route("/v1/chat/completions", handlers.chat_completions, methods=["POST"]),
    Route("/v1/completions", handlers.completions, methods=["POST"]),
    Route("/v1/models", handlers.list_models, methods=["GET"]),
    Route("/v1/streams", handlers.create_stream, methods=["POST"]),
    Route("/v1/streams/{token}", handlers.read_stream, methods=["GET"]),
    Route("/", handlers.chat_page, methods=["GET"]),
    Route("/healthz", handlers.healthz, methods=["GET"]),
    Route("/health", handlers.healthz, methods=["GET"]),  # vLLM's name; its routers poll it
    Route("/readyz", handlers.readyz, methods=["GET"]),
    Route("/metrics", handlers.metrics, methods=["GET"]),
)


def create_app(config: EdgeConfig, state: EdgeState | None = None) -> ASGIApp:
    """The edge as an ASGI app. Channels to workers open at startup, close at shutdown
    (after uvicorn has drained the in-flight streams)."""
    state = state or EdgeState(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.workers = registry_from_config(config)
        state.metrics.extra = [state.workers.render_metrics]
        state.workers.start()
        try:
            yield
        finally:
            await state.workers.close()

    app = Starlette(
        routes=[*ROUTES, *admin.ROUTES],
        exception_handlers={
            ApiError: handlers.on_api_error,
            HTTPException: handlers.on_http_error,
            Exception: handlers.on_unexpected,
        },
        lifespan=lifespan,
    )
    app.state.edge = state
    # Access log, CORS, keys and limits (edge/security.py; it also sets the TLS of worker
    # channels), inside the metrics so that their 401s and 429s are counted.
    secured = install_security(app, config, state.metrics)
    # Outermost, so even the 500s of Starlette's error middleware are counted.
    routes = frozenset(r.path for r in (*ROUTES, *admin.ROUTES))
    return MetricsMiddleware(secured, state.metrics, routes)


def app_from_env() -> ASGIApp:
    """Factory for uvicorn worker processes (`--processes N`): config from the environment."""
    return create_app(EdgeConfig.from_env())
