"""The one table from domain errors to gRPC status codes.

The status carries the human message, and its details a
`google.rpc.ErrorInfo` with the error's stable `reason` (domain "agw.v1") and
metadata, so clients can branch on the reason rather than on the text.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from service.core import errors as e

DOMAIN = "agw.v1"

#: Most specific class first.
STATUS_OF: tuple[tuple[type[e.AgwError], grpc.StatusCode], ...] = (
    (e.InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (e.NotFound, grpc.StatusCode.NOT_FOUND),
    (e.Conflict, grpc.StatusCode.FAILED_PRECONDITION),
    (e.ProviderNotConfigured, grpc.StatusCode.FAILED_PRECONDITION),
    (e.Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (e.PayloadTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (e.BudgetExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (e.ShuttingDown, grpc.StatusCode.UNAVAILABLE),
    (e.ProviderTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
    (e.ProviderError, grpc.StatusCode.UNAVAILABLE),
)


def status_code_of(error: e.AgwError) -> grpc.StatusCode:
    for cls, code in STATUS_OF:
        if isinstance(error, cls):
            return code
    return grpc.StatusCode.INTERNAL


def status_details(error: e.AgwError, code: grpc.StatusCode) -> bytes:
    """A serialized `google.rpc.Status` carrying the error's ErrorInfo."""
    info = any_pb2.Any()
    info.Pack(
        error_details_pb2.ErrorInfo(reason=error.reason, domain=DOMAIN, metadata=error.metadata)
    )
    status = status_pb2.Status(code=code.value[0], message=error.message, details=[info])
    serialized: bytes = status.SerializeToString()
    return serialized


async def abort(context: grpc.aio.ServicerContext[Any, Any], error: e.AgwError) -> None:
    """End the call with the status of `error` (raises, as `context.abort` does)."""
    code = status_code_of(error)
    await context.abort(
        code,
        error.message,
        trailing_metadata=(("grpc-status-details-bin", status_details(error, code)),),
    )
