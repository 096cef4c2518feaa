"""Typed exceptions: gRPC statuses of the gateway, and runs that ended badly.

A call the gateway refuses raises an `RpcError` subclass; it carries the code,
the human message and, from the status details, the `google.rpc.ErrorInfo` the
gateway attaches (domain "agw.v1", a stable `reason` such as "AGENT_NOT_FOUND",
and metadata). The class is chosen by the reason (`AgentNotFound`, `ChatBusy`,
`Overloaded`, ... see `REASON_CLASSES`), each a subclass of the class named
after its status code (`NotFound`, `FailedPrecondition`, ...); a reason this
client does not know gets the status code's class. Branch on the class or on
`reason` rather than on the text. `REASONS` are the reasons declared in
agw/v1/errors.proto.

A run that started and then failed is not a status: its stream ends with a
`run.error` event. The folding helpers turn that into `RunFailed` (and
`run.cancel` into `RunCancelled`) when asked to.
"""

from __future__ import annotations

from typing import Any

import grpc
from agw.v1 import errors_pb2
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


# One class per reason family, under the class of the status the gateway sends it with.


class InvalidRequest(InvalidArgument):
    """The request is malformed or misses a required field, or a definition is invalid."""


class AgentNotFound(NotFound):
    """No agent has the requested key."""


class ChatNotFound(NotFound):
    """No chat has the requested id."""


class RunNotFound(NotFound):
    """No active, recent or archived run has the requested id."""


class ToolNotFound(NotFound):
    """An agent names a tool that is not defined."""


class Conflict(FailedPrecondition):
    """The request conflicts with the gateway's current state."""


class ChatBusy(Conflict):
    """The chat has an active run and the query's multitask strategy is to reject."""


class ProviderNotConfigured(FailedPrecondition):
    """An agent names a provider that the gateway's settings do not define."""


class Overloaded(ResourceExhausted):
    """Too many active runs; retry later."""


class PayloadTooLarge(ResourceExhausted):
    """A payload or upload exceeds its configured limit."""


class QuotaExceeded(ResourceExhausted):
    """The caller's tenant or API key used up a quota; retry after `retry_after` seconds.

    `metadata` names the `quota` (concurrent_runs, requests_per_minute, tokens_per_day,
    spend_per_month), its `scope` (tenant or key) and `limit`."""

    @property
    def retry_after(self) -> float | None:
        """Seconds to wait before trying again, as the gateway said (None: not said)."""
        try:
            return float(self.metadata["retry_after_s"])
        except (KeyError, ValueError):
            return None


class BudgetExhausted(ResourceExhausted):
    """A run used up one of its budgets (once the run started: `RunFailed` with this reason)."""


class ShuttingDown(Unavailable):
    """The gateway is draining and accepts no new runs; retry on another instance."""


class ProviderError(Unavailable):
    """A model provider failed: connection, HTTP status, or an error in its stream.

    Providers are called once a run has started, so this usually arrives as a
    run's failure instead: `RunFailed` with reason "PROVIDER_ERROR".
    """


class OwnerLost(Unavailable):
    """The replica executing a run was lost (in a run: `RunFailed` with this reason), or did
    not answer a Submit or Cancel in time; retry."""


class RunHandedOver(Unavailable):
    """The stream of a run ended because the gateway process running it shut down and handed
    it over: the run goes on. Re-attach (`attach`) with `run_id` and `after_seq`, the last
    seq this stream gave (both in `metadata`)."""


class BusUnavailable(Unavailable):
    """The gateway's run bus (Redis) is unreachable; nothing was done: retry (in a run:
    `RunFailed` with this reason)."""


class ProviderTimeout(DeadlineExceeded):
    """A provider did not connect or send data in time (in a run: `RunFailed` with this reason)."""


#: The one table: reason (as the proto enum's value) → the class a refused call raises.
#: Reasons only ever sent in `task.fail` events (TASK_FAILED, TASK_NOT_REPORTED) have none.
_CLASS_OF: dict[errors_pb2.ErrorReason.ValueType, type[RpcError]] = {
    errors_pb2.ERROR_REASON_INTERNAL: Internal,
    errors_pb2.ERROR_REASON_INVALID_REQUEST: InvalidRequest,
    errors_pb2.ERROR_REASON_NOT_FOUND: NotFound,
    errors_pb2.ERROR_REASON_AGENT_NOT_FOUND: AgentNotFound,
    errors_pb2.ERROR_REASON_CHAT_NOT_FOUND: ChatNotFound,
    errors_pb2.ERROR_REASON_RUN_NOT_FOUND: RunNotFound,
    errors_pb2.ERROR_REASON_TOOL_NOT_FOUND: ToolNotFound,
    errors_pb2.ERROR_REASON_CONFLICT: Conflict,
    errors_pb2.ERROR_REASON_CHAT_BUSY: ChatBusy,
    errors_pb2.ERROR_REASON_PROVIDER_NOT_CONFIGURED: ProviderNotConfigured,
    errors_pb2.ERROR_REASON_OVERLOADED: Overloaded,
    errors_pb2.ERROR_REASON_PAYLOAD_TOO_LARGE: PayloadTooLarge,
    errors_pb2.ERROR_REASON_BUDGET_EXHAUSTED: BudgetExhausted,
    errors_pb2.ERROR_REASON_QUOTA_EXCEEDED: QuotaExceeded,
    errors_pb2.ERROR_REASON_SHUTTING_DOWN: ShuttingDown,
    errors_pb2.ERROR_REASON_PROVIDER_ERROR: ProviderError,
    errors_pb2.ERROR_REASON_PROVIDER_STREAM_ERROR: ProviderError,
    errors_pb2.ERROR_REASON_PROVIDER_TIMEOUT: ProviderTimeout,
    errors_pb2.ERROR_REASON_OWNER_LOST: OwnerLost,
    errors_pb2.ERROR_REASON_BUS_UNAVAILABLE: BusUnavailable,
    errors_pb2.ERROR_REASON_RUN_HANDED_OVER: RunHandedOver,
    errors_pb2.ERROR_REASON_STORE_FAILED: Internal,
    errors_pb2.ERROR_REASON_SANDBOX_UNAVAILABLE: Internal,
    errors_pb2.ERROR_REASON_PLAN_FAILED: Internal,
    errors_pb2.ERROR_REASON_UNAUTHENTICATED: Unauthenticated,
    errors_pb2.ERROR_REASON_PERMISSION_DENIED: PermissionDenied,
}

_PREFIX = "ERROR_REASON_"


def reason_name(value: errors_pb2.ErrorReason.ValueType) -> str:
    """The wire string of an `ErrorReason` value: its name without the prefix."""
    return errors_pb2.ErrorReason.Name(value).removeprefix(_PREFIX)


#: Every reason declared in agw/v1/errors.proto, as sent on the wire.
REASONS: frozenset[str] = frozenset(
    reason_name(value)
    for value in errors_pb2.ErrorReason.values()
    if value != errors_pb2.ERROR_REASON_UNSPECIFIED
)

#: Reason (as sent) → the class a call refused with it raises.
REASON_CLASSES: dict[str, type[RpcError]] = {
    reason_name(value): cls for value, cls in _CLASS_OF.items()
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
    return error_class(code, reason)(
        code, message, reason=reason, domain=domain, metadata=metadata, status=status
    )


def error_class(code: grpc.StatusCode, reason: str = "") -> type[RpcError]:
    """The class of a status: the reason's, when it is known and sent with this code."""
    by_reason = REASON_CLASSES.get(reason)
    if by_reason is not None and by_reason.status_code == code:
        return by_reason
    return _BY_CODE.get(code, RpcError)


def _status_of(trailers: Any) -> status_pb2.Status | None:
    for key, value in trailers or ():
        if key == _DETAILS_KEY and isinstance(value, bytes):
            status = status_pb2.Status()
            status.ParseFromString(value)
            return status
    return None
