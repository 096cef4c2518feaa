"""Typed exceptions: gRPC statuses of the gateway, and runs that ended badly.

A call the gateway refuses raises an `RpcError` subclass chosen by its status
code; it carries the code, the human message and, from the status details, the
`google.rpc.ErrorInfo` the gateway attaches (domain "agw.v1", a stable
`reason` such as "AGENT_NOT_FOUND", and metadata). Branch on `reason` rather
than on the text.

A run that started and then failed is not a status: its stream ends with a
`run.error` event. The folding helpers turn that into `RunFailed` (and
`run.cancel` into `RunCancelled`) when asked to.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

DOMAIN = "agw.v1"
_DETAILS_KEY = "grpc-status-details-bin"


class AgwError(Exception):
    """Base of every error raised by this client."""

    def __init__(self, message: str, *, reason: str = "", metadata: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.metadata = dict(metadata or {})


class RpcError(AgwError):
    """The gateway answered a call with a non-OK gRPC status."""

    #: The status code this class stands for (None on the base class).
    status_code: grpc.StatusCode | None = None

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str = "",
        domain: str = "",
        metadata: dict[str, str] | None = None,
        status: status_pb2.Status | None = None,
    ) -> None:
        super().__init__(message, reason=reason, metadata=metadata)
        self.code = code
        self.domain = domain
        #: The full `google.rpc.Status` from the trailers, when the server sent one.
        self.status = status

    def __str__(self) -> str:
        reason = f" ({self.reason})" if self.reason else ""
        return f"{self.code.name}: {self.message}{reason}"


class InvalidArgument(RpcError):
    """The request is malformed or misses a required field."""

    status_code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(RpcError):
    """A named agent, chat, run or tool does not exist."""

    status_code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(RpcError):
    """The request conflicts with the server's state (e.g. provider not configured)."""

    status_code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(RpcError):
    """Too many runs, or a payload or budget over its limit."""

    status_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(RpcError):
    """The server cannot be reached or is shutting down."""

    status_code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(RpcError):
    """The call's deadline passed."""

    status_code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(RpcError):
    """The call was cancelled."""

    status_code = grpc.StatusCode.CANCELLED


class Unauthenticated(RpcError):
    """The call carried no valid credentials."""

    status_code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(RpcError):
    """The credentials do not allow the call."""

    status_code = grpc.StatusCode.PERMISSION_DENIED


class Unimplemented(RpcError):
    """The server does not offer this RPC."""

    status_code = grpc.StatusCode.UNIMPLEMENTED


class Internal(RpcError):
    """The server failed unexpectedly."""

    status_code = grpc.StatusCode.INTERNAL


_BY_CODE: dict[grpc.StatusCode, type[RpcError]] = {
    cls.status_code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        FailedPrecondition,
        ResourceExhausted,
        Unavailable,
        DeadlineExceeded,
        Cancelled,
        Unauthenticated,
        PermissionDenied,
        Unimplemented,
        Internal,
    )
    if cls.status_code is not None
}


class RunFailed(AgwError):
    """A run ended with `run.error`; `reason` is its stable reason (e.g. "PROVIDER_ERROR")."""

    def __init__(
        self, message: str, *, reason: str, metadata: dict[str, str], run_id: str = ""
    ) -> None:
        super().__init__(message, reason=reason, metadata=metadata)
        self.run_id = run_id

    def __str__(self) -> str:
        return f"run {self.run_id} failed: {self.reason}: {self.message}"


class RunCancelled(AgwError):
    """A run ended with `run.cancel`; `reason` is "cancel", "disconnect", "shutdown", ..."""

    def __init__(self, reason: str, *, run_id: str = "") -> None:
        super().__init__(f"run {run_id} was cancelled ({reason})", reason=reason)
        self.run_id = run_id


def from_rpc_error(error: grpc.RpcError) -> RpcError:
    """Translate a grpc (sync or asyncio) error into the matching `RpcError` subclass."""
    call: Any = error  # grpc's errors are also Calls: code(), details(), trailing_metadata()
    code: grpc.StatusCode = call.code()
    message: str = call.details() or ""
    status = _status_of(call.trailing_metadata())
    reason, domain, metadata = "", "", {}
    if status is not None:
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info):
                reason, domain, metadata = info.reason, info.domain, dict(info.metadata)
                break
    cls = _BY_CODE.get(code, RpcError)
    return cls(code, message, reason=reason, domain=domain, metadata=metadata, status=status)


def _status_of(trailers: Any) -> status_pb2.Status | None:
    for key, value in trailers or ():
        if key == _DETAILS_KEY and isinstance(value, bytes):
            status = status_pb2.Status()
            status.ParseFromString(value)
            return status
    return None
