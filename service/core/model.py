"""The model port: what the core asks of a language model, and what it gets back.

A provider streams one `ModelDelta` per upstream chunk, in arrival order, with
nothing merged or split. `ModelClient.stream` is an async context manager so
that leaving the block (normally, by error or by cancellation) closes the
upstream request at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

Effort = Literal["LOW", "MEDIUM", "HIGH"]
ToolChoice = Literal["auto", "none", "required"]


@dataclass(frozen=True, slots=True)
class Reasoning:
    """Whether the model should reason before answering, and how hard."""

    enabled: bool = False
    effort: Effort = "MEDIUM"


@dataclass(slots=True)
class ModelRequest:
    """One streaming chat-completions call."""

    provider: str
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: ToolChoice | dict[str, Any] | None = None
    reasoning: Reasoning = Reasoning()
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into the request body
    # Context for the interaction log and traces; never sent upstream.
    run_id: str = ""
    stage: str = ""
    # Told of each attempt of the call by a client that may make several (a model alias:
    # service/providers/routing/); set by whoever observes the call.
    report: CallReport | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts reported by the provider's usage chunk."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0


def add_usage(total: Usage | None, more: Usage) -> Usage:
    """`total` and `more` summed (`more` when there is no total yet)."""
    if total is None:
        return more
    return replace(
        total,
        prompt_tokens=total.prompt_tokens + more.prompt_tokens,
        completion_tokens=total.completion_tokens + more.completion_tokens,
        total_tokens=total.total_tokens + more.total_tokens,
        reasoning_tokens=total.reasoning_tokens + more.reasoning_tokens,
        cached_tokens=total.cached_tokens + more.cached_tokens,
    )


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """One fragment of a streamed tool call.

    `index` identifies the call within the model turn (parallel calls have
    different indexes); `id` and `name` arrive on the call's first fragment
    only; `arguments` is the fragment of JSON text, possibly empty.
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


#: The key, in an assistant message, of what its API needs given back to continue the
#: conversation after it (`ModelDelta.signatures`, collected over the turn).
SIGNATURES = "_signatures"


@dataclass(frozen=True, slots=True)
class ModelDelta:
    """Everything one upstream chunk carried.

    `signatures` are what the API needs given back with the turn's assistant message
    to continue the conversation — a thinking block's signature, a thought signature —
    kept with the message (`SIGNATURES`) and never shown: each is a JSON object whose
    `api` names the API that made it, the rest is that API's business.
    """

    reasoning: str | None = None
    content: str | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()
    finish_reason: str | None = None
    usage: Usage | None = None
    signatures: tuple[dict[str, Any], ...] = ()
    # Set on a delta of its own (no other field) when the call starts over elsewhere.
    restart: Restart | None = None


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try of a call on one deployment of a model alias (numbered from 1)."""

    number: int
    deployment: str
    provider: str
    model: str


@dataclass(frozen=True, slots=True)
class Restart:
    """The call's attempt failed after it had streamed, and the call starts over on the
    next attempt: what the failed one streamed is void (its blocks are to be closed)."""

    failed: Attempt
    error: Exception
    next: Attempt


class CallReport(Protocol):
    """Told of the attempts of one call by a client that may make several (an alias).

    The first attempt is reported as the call is opened, before anything is sent;
    each attempt that fails before the call's first delta is reported failed, and is
    followed by the next attempt, if any. A restart after the first delta is not
    reported here: it comes in the stream (`ModelDelta.restart`).
    """

    def attempt(self, attempt: Attempt) -> None: ...

    def attempt_failed(self, attempt: Attempt, error: Exception) -> None: ...


class ModelClient(Protocol):
    """A provider of streaming chat completions."""

    key: str

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelDelta]]:
        """Open a streaming call; iterate the deltas inside the `async with` block."""
        ...

    async def aclose(self) -> None:
        """Release pooled connections."""
        ...


class ModelRouter(Protocol):
    """Finds the client of a provider key (the providers package implements it)."""

    @property
    def default_key(self) -> str: ...

    def get(self, key: str) -> ModelClient: ...

    def default_model(self, key: str) -> str: ...

    def alias_key(self, model: str) -> str:
        """The key of the client that serves `model` by its name alone (a model alias,
        which routes its calls to deployments), or "" when no alias has that name."""
        ...
