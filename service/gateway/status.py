"""The envelope of unary HTTP answers, and the table from gRPC status to HTTP status.

Success is `{"code": 0, "msg": "success", "data": {...}}`. A failure keeps the
same shape with the gRPC status code as `code` (so `code` is 0 exactly when the
call succeeded), the status message as `msg`, `data: null`, plus the status
name and, when the service sent a `google.rpc.ErrorInfo`, its stable `reason`
and `metadata`:

    {"code": 5, "msg": "no run 'x' (unknown or expired)", "data": null,
     "status": "NOT_FOUND", "reason": "RUN_NOT_FOUND", "metadata": {"runId": "x"}}

HTTP statuses follow grpc-gateway's table. A message the adapter builds from
request input shows each echoed value `shown`: cut at `SHOWN_CHARS`, so an
answer (and a log line) stays small whatever the client sent.
"""

from __future__ import annotations

import math
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

#: gRPC status → HTTP status.
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
}

_DETAILS_KEY = "grpc-status-details-bin"

#: How much of a client's value an error message echoes.
SHOWN_CHARS = 64


def shown(value: str, limit: int = SHOWN_CHARS) -> str:
    """`value` as an error message may echo it: at most `limit` characters, then "…"."""
    return value if len(value) <= limit else value[:limit] + "…"


def success(data: Any) -> dict[str, Any]:
    """The envelope of a successful answer."""
    return {"code": 0, "msg": "success", "data": data}


def failure(
    code: grpc.StatusCode,
    message: str,
    *,
    reason: str = "",
    metadata: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The envelope of a failed answer."""
    body: dict[str, Any] = {
        "code": code.value[0],
        "msg": message or code.name.replace("_", " ").lower(),
        "data": None,
        "status": code.name,
    }
    if reason:
        body["reason"] = reason
    if metadata:
        body["metadata"] = metadata
    return body


def retry_after(envelope: dict[str, Any]) -> dict[str, str]:
    """The `Retry-After` header of a failure whose metadata says when to retry
    (`retry_after_s`, as a quota's refusal does), in whole seconds; else none."""
    value = (envelope.get("metadata") or {}).get("retry_after_s", "")
    try:
        seconds = float(value)
    except ValueError:
        return {}
    return {"Retry-After": str(max(0, math.ceil(seconds)))} if math.isfinite(seconds) else {}


def rpc_failure(error: grpc.aio.AioRpcError) -> tuple[int, dict[str, Any]]:
    """(HTTP status, envelope) of a failed call, with the ErrorInfo the service attached."""
    code = error.code()
    reason, metadata = error_info(error)
    envelope = failure(code, error.details() or "", reason=reason, metadata=metadata)
    return HTTP_STATUS.get(code, 500), envelope


def error_info(error: grpc.aio.AioRpcError) -> tuple[str, dict[str, str]]:
    """The `reason` and `metadata` of the call's `google.rpc.ErrorInfo`, if it has one."""
    for key, value in error.trailing_metadata() or ():
        if key != _DETAILS_KEY or not isinstance(value, bytes):
            continue
        try:
            status = status_pb2.Status.FromString(value)
        except DecodeError:
            return "", {}
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info):
                return info.reason, dict(info.metadata)
    return "", {}
