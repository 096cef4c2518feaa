"""Python client of the agw agent gateway (`agw.v1.AgentGateway` over gRPC).

    from agw_client import AsyncClient, Client

    with Client() as agw:                       # 127.0.0.1:50051 by default
        print(agw.ask("demo_oneshot", "Hello").answer)

The messages are the generated `agw.v1` classes (`Event`, `QueryRequest`, ...):
`query()` yields typed `Event`s, whose payload is in the `payload` oneof.
"""

from __future__ import annotations

try:
    from agw.v1 import events_pb2 as _events
except ImportError as missing:  # pragma: no cover - depends on the installation
    raise ImportError(
        "agw_client needs the generated agw.v1 stubs: install the gateway's repository "
        "(`pip install -e .` at its root, or `make install`), see clients/python/README.md"
    ) from missing

from agw_client.client import AsyncClient, AsyncQueryStream
from agw_client.errors import (
    REASON_CLASSES,
    REASONS,
    AgentNotFound,
    AgwError,
    BudgetExhausted,
    BusUnavailable,
    Cancelled,
    ChatBusy,
    ChatNotFound,
    Conflict,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    InvalidRequest,
    NotFound,
    Overloaded,
    OwnerLost,
    PayloadTooLarge,
    PermissionDenied,
    ProviderError,
    ProviderNotConfigured,
    ProviderTimeout,
    QuotaExceeded,
    ResourceExhausted,
    RpcError,
    RunCancelled,
    RunFailed,
    RunHandedOver,
    RunNotFound,
    ShuttingDown,
    ToolNotFound,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from agw_client.fold import (
    RunFolder,
    RunResult,
    ToolCall,
    final_answer,
    fold,
    fold_runs,
    plan,
    tool_calls,
)
from agw_client.messages import TERMINAL_TYPES, event_to_dict, payload_of
from agw_client.options import DEFAULT_TARGET, ClientOptions
from agw_client.sync import Client, QueryStream

Event = _events.Event

__all__ = [
    "DEFAULT_TARGET",
    "REASONS",
    "REASON_CLASSES",
    "TERMINAL_TYPES",
    "AgentNotFound",
    "AgwError",
    "AsyncClient",
    "AsyncQueryStream",
    "BudgetExhausted",
    "BusUnavailable",
    "Cancelled",
    "ChatBusy",
    "ChatNotFound",
    "Client",
    "ClientOptions",
    "Conflict",
    "DeadlineExceeded",
    "Event",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "InvalidRequest",
    "NotFound",
    "Overloaded",
    "OwnerLost",
    "PayloadTooLarge",
    "PermissionDenied",
    "ProviderError",
    "ProviderNotConfigured",
    "ProviderTimeout",
    "QueryStream",
    "QuotaExceeded",
    "ResourceExhausted",
    "RpcError",
    "RunCancelled",
    "RunFailed",
    "RunFolder",
    "RunHandedOver",
    "RunNotFound",
    "RunResult",
    "ShuttingDown",
    "ToolCall",
    "ToolNotFound",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "event_to_dict",
    "final_answer",
    "fold",
    "fold_runs",
    "payload_of",
    "plan",
    "tool_calls",
]
