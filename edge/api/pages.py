"""The small endpoints: the chat page, health and readiness, `/metrics`, `/v1/models`,
and the JSON form of Starlette's own errors (404, 405) and of edge bugs (500)."""

from __future__ import annotations

import importlib.metadata
import logging
from pathlib import Path

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from edge.api.state import EdgeState
from edge.errors import ApiError, error_response, internal_error, no_worker
from edge.obs.prom import CONTENT_TYPE

log = logging.getLogger("sluice.edge")
# The vLLM release whose OpenAI server this edge stands in for (issue 24): vLLM's clients
# read `GET /version` to pick their code paths. A test checks it against the installed vllm.
VLLM_API_VERSION = "0.32.0"
CHAT_PAGE = Path(__file__).parent / "static" / "chat.html"


class ORJSONResponse(Response):
    media_type = "application/json"

    def render(self, content: object) -> bytes:
        return orjson.dumps(content)


def _state(request: Request) -> EdgeState:
    return request.app.state.edge  # type: ignore[no-any-return]


async def chat_page(request: Request) -> Response:
    """GET /: the chat page (plain HTML and JavaScript, no build step, no CDN)."""
    return Response(CHAT_PAGE.read_bytes(), media_type="text/html; charset=utf-8")


async def healthz(request: Request) -> Response:
    """The process is up and its event loop answers (also `/health`, vLLM's name)."""
    return ORJSONResponse({"status": "ok"})


async def version(request: Request) -> Response:
    """GET /version, vLLM's: the vLLM release this edge's API matches, and Sluice's own."""
    return ORJSONResponse({"version": VLLM_API_VERSION, "sluice_version": _sluice_version()})


def _sluice_version() -> str:
    try:
        return importlib.metadata.version("sluice")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


async def readyz(request: Request) -> Response:
    """Ready when at least one worker is SERVING and the edge is not draining."""
    state = _state(request)
    registry = state.registry
    workers = registry.workers if registry is not None else []
    ready = bool(workers) and registry is not None and registry.ready() and not state.draining
    body = {
        "ready": ready,
        "draining": state.draining,
        # Worker keys, not addresses: this endpoint is public (as resume ids, it never
        # shows internal addresses).
        "workers": [{"worker": w.key, "serving": w.serving} for w in workers],
    }
    return ORJSONResponse(body, status_code=200 if ready else 503)


async def metrics(request: Request) -> Response:
    """Prometheus text exposition."""
    state = _state(request)
    if state.shared_metrics is not None:  # --processes N: every process's, merged
        return Response(state.shared_metrics.collect(), media_type=CONTENT_TYPE)
    return Response(render_metrics(state), media_type=CONTENT_TYPE)


def render_metrics(state: EdgeState) -> bytes:
    """This process's metrics."""
    registry = state.registry
    serving = sum(w.serving for w in registry.workers) if registry is not None else 0
    return state.metrics.render(serving)


async def list_models(request: Request) -> Response:
    """GET /v1/models: the models of every SERVING worker, asked now (ListModels), LoRA
    adapters included (with `parent`)."""
    state = _state(request)
    workers = [w for w in state.workers().workers if w.serving]
    if not workers:
        raise no_worker()
    seen: dict[str, dict[str, object]] = {}
    last_error: ApiError | None = None
    for w in workers:
        try:
            models = await w.list_models()
        except ApiError as err:
            last_error = err
            continue
        for m in models:
            seen.setdefault(
                m.id,
                {
                    "id": m.id,
                    "object": "model",
                    "created": 0,
                    "owned_by": "sluice",
                    "max_model_len": m.max_model_len,
                    "engine": m.engine,
                    "version": m.version,
                    # As vLLM lists LoRA adapters: the base model's id, the adapter's path.
                    "parent": m.parent or None,
                    "root": m.path or m.id,
                },
            )
    if not seen and last_error is not None:
        raise last_error
    return ORJSONResponse({"object": "list", "data": list(seen.values())})


async def on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc)


async def on_http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405/...: the same error object as everything else."""
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    err = ApiError(exc.status_code, exc.detail, type=kind, code=f"http_{exc.status_code}")
    return error_response(err, dict(exc.headers or {}))


async def on_unexpected(request: Request, exc: Exception) -> Response:
    """A bug in the edge: the client gets a plain 500 object, the log gets the traceback."""
    return error_response(internal_error())
