"""The edge's routes in one table, and the dispatcher in front of them: generation routes go
straight to their ASGI handlers (no Starlette wrapper between their events and the one
send path); every other route is an ordinary Starlette route."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from edge.api import admin, background, generate, pages, render, stored
from edge.api.state import EdgeState
from edge.errors import ApiError, error_response, internal_error
from edge.obs.record import record_of

log = logging.getLogger("sluice.edge")

Endpoint = Callable[[EdgeState, Request], Awaitable[Any]]
STREAM_LINK = "/v1/streams/"

POST, READ = frozenset({"POST"}), frozenset({"GET", "HEAD"})
GENERATION_ROUTES: dict[str, tuple[frozenset[str], Endpoint]] = {
    "/v1/chat/completions": (POST, lambda s, r: generate.generate(s, r, "chat")),
    "/v1/completions": (POST, lambda s, r: generate.generate(s, r, "completion")),
    "/v1/responses": (POST, lambda s, r: generate.generate(s, r, "responses")),
    "/v1/messages": (POST, lambda s, r: generate.generate(s, r, "messages")),  # Anthropic's
    "/v1/streams": (POST, generate.create_stream),
    # vLLM's render endpoints (token ids only): token-aware routers in front of edges.
    "/v1/chat/completions/render": (POST, lambda s, r: render.render(s, r, "chat")),
    "/v1/completions/render": (POST, lambda s, r: render.render(s, r, "completion")),
    "/v1/messages/count_tokens": (POST, render.count_tokens),
}
PAGE_ROUTES = [
    Route("/", pages.chat_page, methods=["GET"]),
    Route("/v1/models", pages.list_models, methods=["GET"]),
    Route("/healthz", pages.healthz, methods=["GET"]),
    Route("/health", pages.healthz, methods=["GET"]),  # vLLM's name; its routers poll it
    Route("/version", pages.version, methods=["GET"]),  # vLLM's
    Route("/readyz", pages.readyz, methods=["GET"]),
    Route("/metrics", pages.metrics, methods=["GET"]),
    # Stored Responses (`store: true`).
    Route("/v1/responses/{response_id}", background.response, methods=["GET", "DELETE"]),
    Route("/v1/responses/{response_id}/input_items", stored.input_items, methods=["GET"]),
    Route("/v1/responses/{response_id}/cancel", background.cancel, methods=["POST"]),
]
# Every route label the metrics know (parameters as templates).
ROUTE_LABELS = [
    *GENERATION_ROUTES,
    STREAM_LINK + "{token}",
    *(r.path for r in PAGE_ROUTES),
    *(r.path for r in admin.ROUTES),
]


def _read_link(state: EdgeState, request: Request) -> Awaitable[Any]:
    return generate.read_stream(state, request, request.url.path[len(STREAM_LINK) :])


class Dispatch:
    """Generation routes straight to their handler; anything else to `rest` (Starlette)."""

    def __init__(self, state: EdgeState, rest: ASGIApp) -> None:
        self.state = state
        self.rest = rest

    def _route(self, scope: Scope) -> tuple[frozenset[str], Endpoint] | None:
        path = scope["path"]
        found = GENERATION_ROUTES.get(path)
        if found is None and path.startswith(STREAM_LINK) and "/" not in path[len(STREAM_LINK) :]:
            found = (READ, _read_link)
        return found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self._route(scope) if scope["type"] == "http" else None
        if found is None:
            await self.rest(scope, receive, send)
            return
        methods, endpoint = found
        request = Request(scope, receive)
        try:
            if scope["method"] not in methods:
                raise ApiError(
                    405, "Method Not Allowed", code="http_405", type="invalid_request_error"
                )
            response = await endpoint(self.state, request)
        except ClientDisconnect:
            # Gone while sending its body: nobody to answer, and not the edge's fault.
            self.state.metrics.client_disconnects[record_of(scope).route] += 1
            return
        except ApiError as err:
            response = error_response(err)
        except Exception:
            log.exception("%s %s failed in the edge", scope["method"], scope["path"])
            response = error_response(internal_error())
        await response(scope, receive, send)
