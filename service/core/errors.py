"""One tree of domain errors, each with a stable `reason`, and the one table of them.

Every error that crosses the wire is defined here. `STATUS_OF` is the table:
each class → the `Status` a refused call gets; its `reason` (a class attribute)
is the string clients branch on, declared in proto/agw/v1/errors.proto as
`ERROR_REASON_<reason>`. The transport maps `Status` to its protocol's code
(service/transport/errors.py); a run that has started reports the same errors
as `run.error` with the same reason. `EVENT_REASONS` are the reasons sent only
in events (a plan task's `task.fail`), never raised.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Final


class Status(StrEnum):
    """How a refused call is answered: the gRPC status codes the service uses, by name."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    UNAVAILABLE = "UNAVAILABLE"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    INTERNAL = "INTERNAL"


class AgwError(Exception):
    """Base of every foreseeable failure."""

    reason = "INTERNAL"

    def __init__(self, message: str, **metadata: str) -> None:
        super().__init__(message)
        self.message = message
        self.metadata = {k: v for k, v in metadata.items() if v}


class InvalidRequest(AgwError):
    """The request is malformed or misses a required field."""

    reason = "INVALID_REQUEST"


class NotFound(AgwError):
    """A named thing (agent, chat, run, tool) does not exist."""

    reason = "NOT_FOUND"


class AgentNotFound(NotFound):
    reason = "AGENT_NOT_FOUND"


class ChatNotFound(NotFound):
    reason = "CHAT_NOT_FOUND"


class RunNotFound(NotFound):
    reason = "RUN_NOT_FOUND"


class ToolNotFound(NotFound):
    """An agent names a tool that is not defined (or not of the kind it says)."""

    reason = "TOOL_NOT_FOUND"


class Conflict(AgwError):
    """The request conflicts with current state (e.g. a run already active on the chat)."""

    reason = "CONFLICT"


class ChatBusy(Conflict):
    """The chat has an active run and the query's strategy is to reject."""

    reason = "CHAT_BUSY"


class Overloaded(AgwError):
    """Too many concurrent runs; retry later."""

    reason = "OVERLOADED"


class PayloadTooLarge(AgwError):
    """A payload or upload exceeds its configured limit."""

    reason = "PAYLOAD_TOO_LARGE"


class QuotaExceeded(AgwError):
    """The caller's tenant or API key used up a quota (concurrent runs, requests per
    minute, tokens per day, spend per month); `retry_after_s` says when to try again."""

    reason = "QUOTA_EXCEEDED"


class ShuttingDown(AgwError):
    """The service is draining and accepts no new runs."""

    reason = "SHUTTING_DOWN"


class RunHandedOver(AgwError):
    """A run's stream ends because its process is shutting down and handed the run over;
    the run goes on elsewhere (or after the restart): the client re-attaches."""

    reason = "RUN_HANDED_OVER"


class OwnerLost(AgwError):
    """The replica executing a run stopped renewing its lease (it died or was cut off).

    Another replica ends the run with `run.error` of this reason; a Submit or a
    Cancel its owner does not answer in time is refused with it.
    """

    reason = "OWNER_LOST"


class BusUnavailable(AgwError):
    """The run bus (e.g. Redis) could not be reached or did not answer in time.

    A call refused with it changed nothing and may be retried; a run whose
    events can no longer be published ends with `run.error` of this reason.
    """

    reason = "BUS_UNAVAILABLE"


class BudgetExhausted(AgwError):
    """A run used up one of its budgets (model calls, tool calls, steps, time)."""

    reason = "BUDGET_EXHAUSTED"


class ProviderError(AgwError):
    """A model provider failed: connection, HTTP status, stream error or time-out.

    `status` is the HTTP status when there was one; `retryable` says whether
    the call may be retried (only ever before the first byte was received).
    """

    reason = "PROVIDER_ERROR"

    def __init__(
        self,
        provider: str,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
    ) -> None:
        super().__init__(
            f"provider {provider!r}: {message}",
            provider=provider,
            status=str(status) if status is not None else "",
        )
        self.provider = provider
        self.status = status
        self.retryable = retryable


class ProviderStreamError(ProviderError):
    """The provider reported an error inside its stream (an `error` chunk)."""

    reason = "PROVIDER_STREAM_ERROR"


class ProviderTimeout(ProviderError):
    """The provider did not connect or did not send data within the time-out."""

    reason = "PROVIDER_TIMEOUT"


class ProviderNotConfigured(AgwError):
    """An agent names a provider that no setting defines."""

    reason = "PROVIDER_NOT_CONFIGURED"


class StoreFailed(AgwError):
    """Stored state (a chat, a run log, an upload) could not be written or read."""

    reason = "STORE_FAILED"


class SandboxUnavailable(AgwError):
    """The sandbox cannot be built here (missing tool, path or kernel feature)."""

    reason = "SANDBOX_UNAVAILABLE"


class PlanFailed(AgwError):
    """The model did not produce a usable plan."""

    reason = "PLAN_FAILED"


#: The table: every error class that crosses the wire → the status of a refused call.
#: A subclass not listed (e.g. `AgentDefinitionError`) takes its nearest listed base's
#: status and reason. Each status is part of the contract: never change one.
class Unauthenticated(AgwError):
    """The call carries no valid credentials (API key or bearer token)."""

    reason = "UNAUTHENTICATED"


class PermissionDenied(AgwError):
    """The caller's credentials lack the role the call needs (e.g. "admin")."""

    reason = "PERMISSION_DENIED"


STATUS_OF: Final[Mapping[type[AgwError], Status]] = MappingProxyType(
    {
        AgwError: Status.INTERNAL,
        Unauthenticated: Status.UNAUTHENTICATED,
        InvalidRequest: Status.INVALID_ARGUMENT,
        NotFound: Status.NOT_FOUND,
        AgentNotFound: Status.NOT_FOUND,
        ChatNotFound: Status.NOT_FOUND,
        RunNotFound: Status.NOT_FOUND,
        ToolNotFound: Status.NOT_FOUND,
        Conflict: Status.FAILED_PRECONDITION,
        ChatBusy: Status.FAILED_PRECONDITION,
        ProviderNotConfigured: Status.FAILED_PRECONDITION,
        Overloaded: Status.RESOURCE_EXHAUSTED,
        PayloadTooLarge: Status.RESOURCE_EXHAUSTED,
        BudgetExhausted: Status.RESOURCE_EXHAUSTED,
        QuotaExceeded: Status.RESOURCE_EXHAUSTED,
        ShuttingDown: Status.UNAVAILABLE,
        RunHandedOver: Status.UNAVAILABLE,
        ProviderError: Status.UNAVAILABLE,
        ProviderStreamError: Status.UNAVAILABLE,
        ProviderTimeout: Status.DEADLINE_EXCEEDED,
        OwnerLost: Status.UNAVAILABLE,
        BusUnavailable: Status.UNAVAILABLE,
        StoreFailed: Status.INTERNAL,
        SandboxUnavailable: Status.INTERNAL,
        PlanFailed: Status.INTERNAL,
        PermissionDenied: Status.PERMISSION_DENIED,
    }
)

#: A plan task's failure as reported by the model (`task.fail` only).
TASK_FAILED: Final = "TASK_FAILED"
#: The model did not report a plan task, even when asked again (`task.fail` only).
TASK_NOT_REPORTED: Final = "TASK_NOT_REPORTED"
#: The reasons sent only in events, never raised as an error.
EVENT_REASONS: Final[tuple[str, ...]] = (TASK_FAILED, TASK_NOT_REPORTED)


def status_of(error: AgwError) -> Status:
    """The status of `error`: that of its class, or of its nearest listed base."""
    for cls in type(error).__mro__:
        if issubclass(cls, AgwError) and cls in STATUS_OF:
            return STATUS_OF[cls]
    return STATUS_OF[AgwError]


def reasons() -> dict[str, Status | None]:
    """Every reason the service sends → the status of a call refused with it (None: events only)."""
    table: dict[str, Status | None] = {cls.reason: status for cls, status in STATUS_OF.items()}
    return table | dict.fromkeys(EVENT_REASONS)
