"""Domain errors as gRPC statuses.

The core's table (service/core/errors.py) gives each error its `Status` and
stable `reason`; `GRPC_CODE` maps each `Status` to its gRPC code. The status
carries the human message, and its details a `google.rpc.ErrorInfo` with the
reason (domain "agw.v1", declared in proto/agw/v1/errors.proto) and metadata,
so clients can branch on the reason rather than on the text.
"""

from __future__ import annotations

import math
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from service.core import errors as e

DOMAIN = "agw.v1"

# A status travels in HTTP/2 trailers (16 KiB by default, for all of them; past 8 KiB a
# client refuses some at random): messages and metadata that echo input are cut to these
# many UTF-8 bytes, so that a refusal always fits, even percent-encoded (3 bytes a byte).
MAX_MESSAGE = 1024
MAX_METADATA_VALUE = 256

#: The core's status kinds → gRPC status codes.
GRPC_CODE: dict[e.Status, grpc.StatusCode] = {
    e.Status.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    e.Status.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    e.Status.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    e.Status.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    e.Status.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    e.Status.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    e.Status.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    e.Status.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    e.Status.INTERNAL: grpc.StatusCode.INTERNAL,
}


def status_code_of(error: e.AgwError) -> grpc.StatusCode:
    """The gRPC code of `error`, from the core's table."""
    return GRPC_CODE[e.status_of(error)]


def _cut(text: str, limit: int) -> str:
    """`text` within `limit` UTF-8 bytes (then "…"), never splitting a character."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[:limit].decode(errors="ignore") + "…"


def status_details(error: e.AgwError, code: grpc.StatusCode) -> bytes:
    """A serialized `google.rpc.Status` carrying the error's ErrorInfo."""
    info = any_pb2.Any()
    metadata = {k[:64]: _cut(v, MAX_METADATA_VALUE) for k, v in error.metadata.items()}
    info.Pack(error_details_pb2.ErrorInfo(reason=error.reason, domain=DOMAIN, metadata=metadata))
    details = [info]
    delay = _retry_delay(error)
    if delay is not None:  # when to retry, as gRPC clients' retry policies read it
        retry = any_pb2.Any()
        retry.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        details.append(retry)
    message = _cut(error.message, MAX_MESSAGE)
    status = status_pb2.Status(code=code.value[0], message=message, details=details)
    serialized: bytes = status.SerializeToString()
    return serialized


def _retry_delay(error: e.AgwError) -> duration_pb2.Duration | None:
    """The error's `retry_after_s` as a Duration, when it has one."""
    try:
        seconds = float(error.metadata["retry_after_s"])
    except (KeyError, ValueError):
        return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    delay = duration_pb2.Duration()
    delay.FromMilliseconds(round(seconds * 1000))
    return delay


async def abort(context: grpc.aio.ServicerContext[Any, Any], error: e.AgwError) -> None:
    """End the call with the status of `error` (raises, as `context.abort` does)."""
    code = status_code_of(error)
    await context.abort(
        code,
        _cut(error.message, MAX_MESSAGE),
        trailing_metadata=(("grpc-status-details-bin", status_details(error, code)),),
    )
