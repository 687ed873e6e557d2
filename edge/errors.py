"""Edge errors and the one gRPC status -> HTTP table. Before the first byte an `ApiError` is an
HTTP status with an error body; after it, the stream's final `event: error` (plus
`retryable`). The body is in the dialect of the API called (`dialect_of` its path): OpenAI's
object, or Anthropic's under `/v1/messages`. Messages are ours or the worker's status
details: never a traceback."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

import grpc
import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sluice_common.contract import FIELD_KEY, RETRY_AFTER_KEY

# The worker writes INVALID_ARGUMENT messages as "<field path>: <why>".
_FIELD_PREFIX = re.compile(r"^([a-z_]+(?:\.[a-z_]+|\[\d+\])*): ")
# Details written by the gRPC library itself (not the worker) about the connection.
_TRANSPORT_DETAIL = re.compile(
    r"ipv[46]:|unix:|failed to connect|Socket closed|Connection reset|RST_STREAM|GOAWAY|"
    r"Broken pipe|connection refused|Connection refused",
)
# Contract field paths -> OpenAI request parameter names.
_FIELD_RENAMES = {
    "chat.messages": "messages",
    "inputs": "input",  # `Embed`
    "prompt_tokens": "prompt",
    "chat.tools": "tools",
    "chat.tool_choice": "tool_choice",
    "chat.continue_final_message": "continue_final_message",
    "chat.template_kwargs_json": "chat_template_kwargs",
    "chat.documents": "documents",
    "sampling.logprobs": "logprobs",
    "structured_output": "response_format",
}


@dataclass(frozen=True, slots=True)
class Mapping:
    """How one gRPC status code looks over HTTP."""

    status: int
    type: str
    code: str
    retryable: bool


# The one table. Overload and unavailability carry Retry-After (from `retry-after-ms`).
GRPC_TO_HTTP: dict[grpc.StatusCode, Mapping] = {
    grpc.StatusCode.INVALID_ARGUMENT: Mapping(400, "invalid_request_error", "invalid_value", False),
    grpc.StatusCode.FAILED_PRECONDITION: Mapping(
        400, "invalid_request_error", "failed_precondition", False
    ),
    grpc.StatusCode.OUT_OF_RANGE: Mapping(400, "invalid_request_error", "out_of_range", False),
    grpc.StatusCode.NOT_FOUND: Mapping(404, "invalid_request_error", "not_found", False),
    grpc.StatusCode.ALREADY_EXISTS: Mapping(409, "invalid_request_error", "already_exists", False),
    grpc.StatusCode.RESOURCE_EXHAUSTED: Mapping(429, "rate_limit_error", "overloaded", True),
    grpc.StatusCode.UNAVAILABLE: Mapping(503, "server_error", "unavailable", True),
    grpc.StatusCode.DEADLINE_EXCEEDED: Mapping(504, "timeout_error", "deadline_exceeded", False),
    grpc.StatusCode.CANCELLED: Mapping(499, "cancelled", "cancelled", False),
    grpc.StatusCode.UNIMPLEMENTED: Mapping(501, "server_error", "unimplemented", False),
}
DEFAULT_MAPPING = Mapping(502, "server_error", "upstream_error", False)

Dialect = Literal["openai", "anthropic"]
ANTHROPIC_PATH = "/v1/messages"
# Anthropic's error types by HTTP status (its `{"type": "error", "error": {...}}` body);
# any other 5xx is `api_error`, any other 4xx `invalid_request_error`.
_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def dialect_of(path: str) -> Dialect:
    """Whose error shape a path answers in: Anthropic's for its Messages API."""
    if path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/"):
        return "anthropic"
    return "openai"


# Status codes with a retry hint: Retry-After is sent even without one from the worker.
DEFAULT_RETRY_AFTER_S = 1.0


class ApiError(Exception):
    """An error the client sees; `status` is the HTTP status before streaming starts."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retryable: bool = False,
        retry_after_s: float | None = None,
        extra: dict[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.extra = extra  # more fields of the error object (e.g. a budget's reset time)

    def body(self, dialect: Dialect = "openai") -> dict[str, object]:
        """The error object: OpenAI's, or Anthropic's (which has no `param`: the message
        names it)."""
        if dialect == "anthropic":
            kind = _ANTHROPIC_TYPES.get(self.status)
            if kind is None:
                kind = "api_error" if self.status >= 500 else "invalid_request_error"
            message = self.message
            if self.param and self.param not in message:  # name it, if the message does not
                message = f"{self.param}: {message}"
            return {"type": "error", "error": {"type": kind, "message": message}}
        error: dict[str, object] = {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.code,
        }
        if self.extra:
            error.update(self.extra)
        return {"error": error}

    def json(self, dialect: Dialect = "openai") -> bytes:
        return orjson.dumps(self.body(dialect))

    def event_json(self, last_event_id: str | None = None, dialect: Dialect = "openai") -> bytes:
        """The data of the final `event: error` of a stream (`last_event_id`: the id of
        the last event the client got, to resume from)."""
        body = self.body(dialect)
        err = body["error"]
        assert isinstance(err, dict)
        err["retryable"] = self.retryable
        if self.retry_after_s is not None:
            err["retry_after_ms"] = int(self.retry_after_s * 1000)
        if last_event_id is not None:
            err["last_event_id"] = last_event_id
        return orjson.dumps(body)

    def headers(self) -> dict[str, str]:
        """Retry-After (whole seconds, at least 1) and the finer `retry-after-ms`."""
        if self.retry_after_s is None:
            return {}
        return {
            "retry-after": str(max(1, math.ceil(self.retry_after_s))),
            "retry-after-ms": str(max(1, int(self.retry_after_s * 1000))),
        }


class ErrorResponse(Response):
    """An ApiError as a whole HTTP response, its body in the dialect of the path it
    answers (known only when it is sent: middleware answers with it too)."""

    media_type = "application/json"

    def __init__(self, err: ApiError, headers: dict[str, str]) -> None:
        super().__init__(err.json(), status_code=err.status, headers=headers)
        # Handled: its traceback's frames hold this response, which holds it (a cycle
        # that only a collection frees).
        err.__traceback__ = None
        self.err = err
        self._extra = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        dialect = dialect_of(scope.get("path", ""))
        if dialect == "openai":
            await super().__call__(scope, receive, send)
            return
        body = self.err.json(dialect)
        await Response(body, self.status_code, self._extra, self.media_type)(scope, receive, send)


def error_response(err: ApiError, headers: dict[str, str] | None = None) -> Response:
    """The one writer of an ApiError as a whole HTTP response (also an ASGI app, so
    middleware answers with it too). `headers`: more of them (e.g. WWW-Authenticate)."""
    return ErrorResponse(err, {**err.headers(), **(headers or {})})


def invalid(param: str | None, message: str) -> ApiError:
    """A request the edge refuses before calling any worker."""
    return ApiError(400, message, param=param, code="invalid_value")


def internal_error() -> ApiError:
    """What a client sees for a bug in the edge: no detail (it is in the log)."""
    return ApiError(500, "internal error in the edge", type="server_error", code="internal_error")


def no_worker() -> ApiError:
    return from_status(grpc.StatusCode.UNAVAILABLE, "no model worker is available")


def openai_param(field: str) -> str:
    """A contract field path as an OpenAI parameter name ("sampling.top_p" -> "top_p")."""
    for old, new in _FIELD_RENAMES.items():
        if field == old or field.startswith((old + ".", old + "[")):
            return new + field[len(old) :]
    return field.removeprefix("sampling.").removeprefix("chat.")


def from_status(
    code: grpc.StatusCode,
    message: str,
    *,
    field: str = "",
    retry_after_ms: int = 0,
) -> ApiError:
    """Map one gRPC status (from an RPC's end or an in-band `Final.error`) to an ApiError."""
    m = GRPC_TO_HTTP.get(code, DEFAULT_MAPPING)
    param: str | None = None
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        if not field and (match := _FIELD_PREFIX.match(message)):
            field = match.group(1)
        param = openai_param(field) if field else None
    elif code == grpc.StatusCode.NOT_FOUND and "model" in message:
        param = "model"
    retry: float | None = None
    if m.retryable:
        retry = retry_after_ms / 1000 if retry_after_ms > 0 else DEFAULT_RETRY_AFTER_S
    if m.status == 502:
        # A worker fault: say which status without passing its detail (may be a repr) on.
        message = f"upstream worker error ({code.name})"
    elif _TRANSPORT_DETAIL.search(message):
        # gRPC's own transport messages name internal addresses; say it plainly instead.
        message = f"model worker unreachable ({code.name})"
    return ApiError(
        m.status,
        message or code.name.lower(),
        type=m.type,
        param=param,
        code="model_not_found" if param == "model" and m.status == 404 else m.code,
        retryable=m.retryable,
        retry_after_s=retry,
    )


def from_rpc_error(err: grpc.aio.AioRpcError) -> ApiError:
    """An RPC's failure status, with the worker's trailing-metadata hints."""
    retry_ms = 0
    field = ""
    for key, value in err.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY:
            try:
                retry_ms = int(value)
            except (TypeError, ValueError):
                retry_ms = 0
        elif key == FIELD_KEY and isinstance(value, str):
            field = value
    return from_status(err.code(), err.details() or "", field=field, retry_after_ms=retry_ms)


def from_status_code_number(number: int) -> grpc.StatusCode:
    """google.rpc.Code numbering (as in the contract's `Status.code`) -> grpc.StatusCode."""
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code
    return grpc.StatusCode.UNKNOWN
