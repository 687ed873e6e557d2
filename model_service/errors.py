"""Domain exceptions, each bound to one gRPC status code (mapped in `rpc/status.py`): the
caller's mistakes never become INTERNAL."""

from __future__ import annotations

import grpc

# A status message is a header (`grpc-message`, percent-encoded): one that echoes a huge
# value of the request (a 100 KB model name) would pass the client's metadata limit (8 KB), and
# the caller would get RESOURCE_EXHAUSTED "Stream removed" instead of the error.
MAX_MESSAGE_CHARS = 500  # 6 KB as percent-encoded UTF-8 at most


class SluiceError(Exception):
    """Base class: a failure with a gRPC status code and a message safe for clients (at
    most `MAX_MESSAGE_CHARS`, cut with an ellipsis)."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    retryable: bool = False

    def __init__(self, message: str, *, field: str = "", retry_after_s: float = 0.0) -> None:
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 1] + "…"
        super().__init__(message)
        self.message = message
        self.field = field
        self.retry_after_s = retry_after_s


class InvalidArgument(SluiceError):
    """The request is malformed; `field` names the offending field."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message, field=field)


class NotFound(SluiceError):
    """Unknown model or generation."""

    code = grpc.StatusCode.NOT_FOUND


class Overloaded(SluiceError):
    """Queue or KV budget is full; retry after `retry_after_s`."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    retryable = True


class NoAdapterSlot(SluiceError):
    """Every LoRA adapter slot is taken: waiting does not help, unloading one does."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(SluiceError):
    """The worker is starting, draining or its engine died."""

    code = grpc.StatusCode.UNAVAILABLE
    retryable = True


class EngineDead(Unavailable):
    """The engine died: this worker cannot serve until it is restarted."""


class DeadlineExceeded(SluiceError):
    """The generation ran past its deadline."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED
    retryable = False


class FailedPrecondition(SluiceError):
    """The request is valid but not in this state of the stream (e.g. duplicate id)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class EngineError(SluiceError):
    """The engine failed on its own: a worker-side fault."""

    code = grpc.StatusCode.INTERNAL


class AlreadyExists(SluiceError):
    """A generation with this request id is live already."""

    code = grpc.StatusCode.ALREADY_EXISTS


class OutOfRange(SluiceError):
    """A resume index beyond what the generation has produced."""

    code = grpc.StatusCode.OUT_OF_RANGE
