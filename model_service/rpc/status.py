"""The one place where domain errors become gRPC statuses."""

from __future__ import annotations

from typing import NoReturn

import grpc

from model_service.errors import SluiceError
from sluice_common.contract import FIELD_KEY, RETRY_AFTER_KEY


def trailing_metadata(err: SluiceError) -> tuple[tuple[str, str], ...]:
    """Retry hint (`retry-after-ms`) and offending field (`x-sluice-field`), when known."""
    md: list[tuple[str, str]] = []
    if err.retry_after_s > 0:
        md.append((RETRY_AFTER_KEY, str(max(1, int(err.retry_after_s * 1000)))))
    if err.field:
        md.append((FIELD_KEY, err.field))
    return tuple(md)


async def abort_with(context: grpc.aio.ServicerContext, err: SluiceError) -> NoReturn:
    """End the RPC with the error's status code, message and retry hint."""
    await context.abort(err.code, err.message, trailing_metadata(err))
    raise AssertionError("unreachable")  # context.abort always raises
