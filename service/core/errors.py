"""One tree of domain errors, each with a stable `reason`.

The transport maps each class to a gRPC status (service/transport/errors.py);
a run that has started reports them as `run.error` with the same reason.
"""

from __future__ import annotations


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


class Conflict(AgwError):
    """The request conflicts with current state (e.g. a run already active on the chat)."""

    reason = "CONFLICT"


class Overloaded(AgwError):
    """Too many concurrent runs; retry later."""

    reason = "OVERLOADED"


class PayloadTooLarge(AgwError):
    """A payload or upload exceeds its configured limit."""

    reason = "PAYLOAD_TOO_LARGE"


class ShuttingDown(AgwError):
    """The service is draining and accepts no new runs."""

    reason = "SHUTTING_DOWN"


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
        reason: str | None = None,
    ) -> None:
        super().__init__(
            f"provider {provider!r}: {message}",
            provider=provider,
            status=str(status) if status is not None else "",
        )
        self.provider = provider
        self.status = status
        self.retryable = retryable
        if reason:
            self.reason = reason


class ProviderTimeout(ProviderError):
    """The provider did not connect or did not send data within the time-out."""

    reason = "PROVIDER_TIMEOUT"


class ProviderNotConfigured(AgwError):
    """An agent names a provider that no setting defines."""

    reason = "PROVIDER_NOT_CONFIGURED"
