"""Connection options shared by the async and the sync client.

Deadlines: unary calls get `timeout` seconds unless a call says otherwise;
streams (`Query`, `Attach`) get `stream_timeout`, none by default, because a
run may legitimately last long.

Target: `AGW_TARGET` when set, else 127.0.0.1:50051 (where `make run` listens).

Retries: unary calls are retried on `UNAVAILABLE` by gRPC's own retry policy
(declared in the channel's service config, with exponential back-off), up to
`retries` more attempts. A run is not idempotent, so a stream is not sent again
as such; instead a stream follows its run (`Follow`): once it knows its run's id,
a stream cut with `UNAVAILABLE` — the gateway process shut down and handed the run
over (`RUN_HANDED_OVER`), or the connection was lost — re-attaches through the same
target, after the last seq it gave, so the caller sees one stream with no gap and no
duplicate; a query refused `SHUTTING_DOWN` (nothing was started) is sent again. At
most `reattach_attempts` times in a row without a new event, with the back-off of the
retries.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import grpc

DEFAULT_TARGET = "127.0.0.1:50051"
SERVICE = "agw.v1.AgentGateway"
UNARY_METHODS = (
    "Submit",
    "Cancel",
    "ListAgents",
    "GetAgent",
    "ListChats",
    "GetChat",
    "Upload",
)
#: gRPC caps a retry policy at 5 attempts in all.
MAX_RETRIES = 4

Metadata = tuple[tuple[str, str], ...]


def default_target() -> str:
    """`AGW_TARGET` when set, else `DEFAULT_TARGET`."""
    return os.environ.get("AGW_TARGET") or DEFAULT_TARGET


@dataclass(frozen=True)
class ClientOptions:
    """How to reach the gateway and how to call it."""

    #: host:port of the gateway (any gRPC target string, e.g. "dns:///agw.internal:443");
    #: by default `AGW_TARGET`, else 127.0.0.1:50051.
    target: str = field(default_factory=default_target)
    #: Use TLS; `root_certificates` (PEM) replaces the system roots when given.
    tls: bool = False
    root_certificates: bytes | None = None
    #: Sent as `authorization: Bearer <token>` on every call.
    token: str | None = None
    #: Further metadata sent on every call, e.g. (("x-tenant", "acme"),).
    metadata: Metadata = ()
    #: Deadline of unary calls, in seconds (None: no deadline).
    timeout: float | None = 30.0
    #: Deadline of `Query` and `Attach` streams, in seconds (None: no deadline).
    stream_timeout: float | None = None
    #: Further attempts of a unary call answered with UNAVAILABLE (0 disables, at most 4).
    retries: int = 3
    #: First back-off between attempts, and its ceiling, in seconds (doubling in between).
    retry_backoff: float = 0.2
    retry_max_backoff: float = 5.0
    #: How often in a row a stream re-attaches to its run (or sends a query the gateway
    #: refused as it shut down) without a new event, before it raises (0: never).
    reattach_attempts: int = 8
    #: Extra channel arguments, e.g. (("grpc.keepalive_time_ms", 30000),).
    channel_options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.retries <= MAX_RETRIES:
            raise ValueError(f"retries must be between 0 and {MAX_RETRIES}")
        if self.retry_backoff <= 0 or self.retry_max_backoff < self.retry_backoff:
            raise ValueError("need 0 < retry_backoff <= retry_max_backoff")
        if self.reattach_attempts < 0:
            raise ValueError("reattach_attempts must be >= 0")

    def credentials(self) -> grpc.ChannelCredentials | None:
        """Channel credentials for TLS, or None for a plaintext channel."""
        if not self.tls and self.root_certificates is None:
            return None
        return grpc.ssl_channel_credentials(root_certificates=self.root_certificates)

    def call_metadata(self) -> Metadata:
        """The metadata every call carries."""
        extra: Metadata = (("authorization", f"Bearer {self.token}"),) if self.token else ()
        return (*self.metadata, *extra)

    def service_config(self) -> dict[str, Any]:
        """gRPC service config: the retry policy of the unary methods."""
        if self.retries == 0:
            return {}
        return {
            "methodConfig": [
                {
                    "name": [{"service": SERVICE, "method": name} for name in UNARY_METHODS],
                    "retryPolicy": {
                        "maxAttempts": self.retries + 1,
                        "initialBackoff": f"{self.retry_backoff}s",
                        "maxBackoff": f"{self.retry_max_backoff}s",
                        "backoffMultiplier": 2,
                        "retryableStatusCodes": ["UNAVAILABLE"],
                    },
                }
            ]
        }

    def channel_args(self) -> list[tuple[str, Any]]:
        """Channel arguments: the retry policy, then `channel_options`."""
        config = self.service_config()
        args: list[tuple[str, Any]] = [("grpc.enable_retries", 1 if config else 0)]
        if config:
            args.append(("grpc.service_config", json.dumps(config)))
        return [*args, *self.channel_options]


def resolve_options(
    target: str | None, options: ClientOptions | None, settings: dict[str, Any]
) -> ClientOptions:
    """The options of a client built as `Client(target, **settings)` or `Client(options=...)`."""
    if options is not None:
        if target is not None or settings:
            raise TypeError("pass either options=ClientOptions(...) or target and keywords")
        return options
    return ClientOptions(**settings) if target is None else ClientOptions(target, **settings)


def call_kwargs(options: ClientOptions, deadline: float | None, *, stream: bool) -> dict[str, Any]:
    """Keyword arguments of one call: its deadline in seconds (the default unless given), and
    the metadata."""
    default = options.stream_timeout if stream else options.timeout
    timeout = default if deadline is None else deadline
    return {"timeout": timeout, "metadata": options.call_metadata()}


#: The reasons of an UNAVAILABLE after which a stream goes on by re-attaching: its run goes
#: on (handed over; or the connection, the gateway process, the run bus was lost).
FOLLOWED = frozenset({"", "RUN_HANDED_OVER", "SHUTTING_DOWN", "BUS_UNAVAILABLE"})


class Follow:
    """How one stream follows its run across hand-overs: whether an error is followed, and
    the back-off before the next attempt."""

    def __init__(self, options: ClientOptions) -> None:
        self.options = options
        self.failures = 0  # attempts in a row without a new event
        self.reattached = 0  # re-attaches (and queries sent again) in all

    def next(self, code: grpc.StatusCode, reason: str, *, run_known: bool) -> str | None:
        """After a stream failed with `code` and `reason`: "attach" (its run goes on: attach
        after the last seq), "query" (the query was refused unstarted: send it again) or
        None (raise). `run_known`: an event of the run arrived (its id is known)."""
        if code != grpc.StatusCode.UNAVAILABLE or self.failures >= self.options.reattach_attempts:
            return None
        if run_known and reason in FOLLOWED:
            return "attach"
        if not run_known and reason == "SHUTTING_DOWN":
            return "query"
        return None

    def backoff(self) -> float:
        """The pause before the next attempt (counted), doubling from `retry_backoff`."""
        self.failures += 1
        self.reattached += 1
        pause = self.options.retry_backoff * 2 ** (self.failures - 1)
        return float(min(pause, self.options.retry_max_backoff))

    def progressed(self) -> None:
        """A new event arrived: the attempts in a row start again."""
        self.failures = 0
