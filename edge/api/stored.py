"""Stored Responses (`store: true`): a response kept in the shared store (`edge.store`:
this process, or Redis with `--store-url`) under its owner, the API key's name (another
key gets a 404), for `--responses-ttl`. `previous_response_id` continues from one on any
replica; `GET` / `DELETE /v1/responses/{id}` and `GET .../input_items` as OpenAI's."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from edge.api.pages import ORJSONResponse
from edge.errors import ApiError, invalid
from edge.obs.record import record_of
from edge.store.base import StoreUnavailable

if TYPE_CHECKING:
    from edge.api.responses import ResponsesFormat
    from edge.api.state import EdgeState

log = logging.getLogger("sluice.edge")
MAX_ITEMS_PAGE = 100


@dataclass(slots=True)
class Conversation:
    """What a stored response keeps besides itself: its own input items (`input_items`),
    and the items before them (`previous_response_id`'s whole conversation)."""

    context: list[Any] = field(default_factory=list)
    input: list[Any] = field(default_factory=list)


def doc_key(owner: str, response_id: str) -> str:
    return f"responses/{owner}/{response_id}"


def owner_of(request: Request) -> str:
    return record_of(request.scope).caller or ""


def store_of(state: EdgeState) -> Any:
    if state.store is None:
        raise ApiError(503, "the edge is starting", type="server_error", code="unavailable")
    return state.store


def unavailable(exc: StoreUnavailable) -> ApiError:
    return ApiError(
        503,
        "stored responses are unavailable now (the shared store failed); retry later",
        type="server_error",
        code="store_unavailable",
        retryable=True,
        retry_after_s=exc.retry_after_s,
    )


def items(given: Any, request_id: str) -> list[Any]:
    """A request's `input` as items with ids, as `input_items` lists them (a string is one
    user message; a message's text content a list of `input_text` parts)."""
    if isinstance(given, str):
        given = [{"type": "message", "role": "user", "content": given}]
    out = []
    for i, item in enumerate(given if isinstance(given, list) else ()):
        if not isinstance(item, dict):
            continue
        item = {"id": f"item_{request_id}_{i}", **item}
        if item.get("type", "message") == "message":
            item["type"] = "message"
            if isinstance(item.get("content"), str):
                item["content"] = [{"type": "input_text", "text": item["content"]}]
        out.append(item)
    return out


async def _load(state: EdgeState, owner: str, response_id: str) -> dict[str, Any] | None:
    try:
        doc = await store_of(state).get_doc(doc_key(owner, response_id))
    except StoreUnavailable as exc:
        raise unavailable(exc) from None
    return None if doc is None else orjson.loads(doc)


async def previous(state: EdgeState, owner: str, body: dict[str, Any]) -> list[Any]:
    """The conversation `previous_response_id` names (its context, input and output), to
    put before this request's input; 404 naming the field when it is not kept for `owner`."""
    response_id = body.get("previous_response_id")
    if not isinstance(response_id, str) or not response_id or len(response_id) > 128:
        raise invalid("previous_response_id", "'previous_response_id' must be a response id")
    doc = await _load(state, owner, response_id)
    if doc is None:
        raise ApiError(
            404,
            f"Previous response with id {response_id!r} not found.",
            param="previous_response_id",
            code="not_found",
        )
    return [*doc["context"], *doc["input"], *doc["response"]["output"]]


async def keep(
    state: EdgeState, owner: str, fmt: ResponsesFormat, conversation: Conversation
) -> None:
    """Store a finished response (called before its last event or body goes out, so a GET
    right after finds it). A failure or a response over the cap is logged: the answer
    still goes out."""
    doc = {"response": fmt.final, "input": conversation.input, "context": conversation.context}
    text = orjson.dumps(doc).decode()
    cfg = state.config.store
    if len(text) > cfg.response_max_bytes:
        log.warning("response %s not stored: %d bytes, over --response-max-bytes",
                    fmt.response_id, len(text))  # fmt: skip
        return
    try:
        await store_of(state).put_doc(doc_key(owner, fmt.response_id), text, cfg.responses_ttl_s)
    except StoreUnavailable as exc:
        log.warning("response %s not stored: %s", fmt.response_id, exc)


def _not_found(response_id: str) -> ApiError:
    return ApiError(
        404, f"Response with id {response_id[:128]!r} not found.", param="response_id",
        type="invalid_request_error", code="not_found",
    )  # fmt: skip


async def found(request: Request) -> tuple[str, dict[str, Any]]:
    state: EdgeState = request.app.state.edge
    response_id = request.path_params["response_id"]
    doc = await _load(state, owner_of(request), response_id)
    if doc is None:
        raise _not_found(response_id)
    return response_id, doc


async def response(request: Request) -> Response:
    """GET /v1/responses/{id}: the stored response; DELETE: forget it."""
    response_id, doc = await found(request)
    if request.method == "DELETE":
        state: EdgeState = request.app.state.edge
        try:
            await store_of(state).delete_doc(doc_key(owner_of(request), response_id))
        except StoreUnavailable as exc:
            raise unavailable(exc) from None
        return ORJSONResponse({"id": response_id, "object": "response", "deleted": True})
    return ORJSONResponse(doc["response"])


async def input_items(request: Request) -> Response:
    """GET /v1/responses/{id}/input_items: its own input items, a page (`order` desc by
    default, `limit` 1-100, `after` an item id)."""
    _, doc = await found(request)
    q = request.query_params
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid("order", "'order' must be 'asc' or 'desc'")
    limit = q.get("limit", "20")
    if not (limit.isascii() and limit.isdigit() and 1 <= int(limit) <= MAX_ITEMS_PAGE):
        raise invalid("limit", f"'limit' must be an integer from 1 to {MAX_ITEMS_PAGE}")
    listed = doc["input"] if order == "asc" else doc["input"][::-1]
    after = q.get("after")
    if after is not None:
        ids = [item.get("id") for item in listed]
        if after not in ids:
            raise invalid("after", "'after' is not an item of this response")
        listed = listed[ids.index(after) + 1 :]
    page = listed[: int(limit)]
    return ORJSONResponse({
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(listed) > len(page),
    })  # fmt: skip
