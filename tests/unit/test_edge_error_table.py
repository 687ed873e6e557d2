"""The gRPC status -> HTTP table, Retry-After, params from the worker's field paths."""

from __future__ import annotations

import grpc
import orjson
import pytest

from edge.errors import ApiError, from_rpc_error, from_status, from_status_code_number, openai_param


@pytest.mark.parametrize(
    ("code", "status", "retryable"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 400, False),
        (grpc.StatusCode.NOT_FOUND, 404, False),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429, True),
        (grpc.StatusCode.UNAVAILABLE, 503, True),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 504, False),
        (grpc.StatusCode.CANCELLED, 499, False),
        (grpc.StatusCode.INTERNAL, 502, False),
        (grpc.StatusCode.UNKNOWN, 502, False),
        (grpc.StatusCode.DATA_LOSS, 502, False),
    ],
)
def test_table(code: grpc.StatusCode, status: int, retryable: bool) -> None:
    err = from_status(code, "why")
    assert err.status == status
    assert err.retryable is retryable
    assert ("retry-after" in err.headers()) is retryable


def test_retry_after_from_worker_hint() -> None:
    err = from_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", retry_after_ms=2500)
    assert err.headers() == {"retry-after": "3", "retry-after-ms": "2500"}
    small = from_status(grpc.StatusCode.UNAVAILABLE, "draining", retry_after_ms=40)
    assert small.headers()["retry-after"] == "1"  # whole seconds, never 0
    default = from_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy")
    assert default.headers()["retry-after"] == "1"


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ("sampling.top_p: must be in (0, 1]", "top_p"),
        ("sampling.max_tokens: 5000 is not below the context window", "max_tokens"),
        ("chat.messages[2].role: unknown role", "messages[2].role"),
        ("chat.messages: content exceeds 10 bytes", "messages"),
        ("prompt: must not be empty", "prompt"),
        ("sampling.stop[1]: must not be empty", "stop[1]"),
        ("sampling.logprobs: at most 20", "logprobs"),
        ("something without a field", None),
    ],
)
def test_invalid_argument_param_from_message(message: str, param: str | None) -> None:
    err = from_status(grpc.StatusCode.INVALID_ARGUMENT, message)
    assert err.status == 400
    assert err.param == param
    assert err.message == message


def test_explicit_field_wins_over_message() -> None:
    err = from_status(grpc.StatusCode.INVALID_ARGUMENT, "bad", field="sampling.seed")
    assert err.param == "seed"


def test_not_found_model() -> None:
    err = from_status(grpc.StatusCode.NOT_FOUND, "model 'x' is not served here")
    assert (err.status, err.param, err.code) == (404, "model", "model_not_found")


def test_worker_faults_do_not_leak_details() -> None:
    err = from_status(grpc.StatusCode.UNKNOWN, "Unexpected <class 'KeyError'>: 'secret'")
    assert "secret" not in err.message and "KeyError" not in err.message
    transport = from_status(
        grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; ipv4:10.0.0.7:50051"
    )
    assert "10.0.0.7" not in transport.message


def test_openai_error_object_shape() -> None:
    err = ApiError(400, "bad", param="top_p", code="invalid_value")
    assert orjson.loads(err.json()) == {
        "error": {
            "message": "bad",
            "type": "invalid_request_error",
            "param": "top_p",
            "code": "invalid_value",
        }
    }


def test_stream_error_event_carries_retryable() -> None:
    err = from_status(grpc.StatusCode.UNAVAILABLE, "worker is draining", retry_after_ms=100)
    data = orjson.loads(err.event_json())["error"]
    assert data["code"] == "unavailable" and data["retryable"] is True
    assert data["message"] == "worker is draining" and data["retry_after_ms"] == 100


def test_contract_code_numbers() -> None:
    assert from_status_code_number(8) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert from_status_code_number(3) == grpc.StatusCode.INVALID_ARGUMENT
    assert from_status_code_number(999) == grpc.StatusCode.UNKNOWN


def test_openai_param_names() -> None:
    assert openai_param("chat.messages[0].content") == "messages[0].content"
    assert openai_param("sampling.frequency_penalty") == "frequency_penalty"
    assert openai_param("model") == "model"


class _RpcError(grpc.aio.AioRpcError):
    """An AioRpcError as grpc builds it (the real class, real constructor)."""


def test_from_rpc_error_reads_trailing_metadata() -> None:
    err = _RpcError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(("retry-after-ms", "1200")),
        details="worker overloaded",
    )
    api = from_rpc_error(err)
    assert api.status == 429 and api.retry_after_s == pytest.approx(1.2)
    assert api.headers()["retry-after"] == "2"
    garbled = _RpcError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(("retry-after-ms", "soon")),
    )
    assert from_rpc_error(garbled).headers()["retry-after"] == "1"
