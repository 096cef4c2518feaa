"""What a provider reports while it opens a model call, to whoever instruments the call.

A provider opening a call (`ModelClient.stream`) reports to `current()` the
request it sends (and which values in it are secrets) and each retry before the
first byte. `current()` is the observer of the call being opened in this task,
set with `observing(...)` around the opening by whoever instruments the call —
the interaction log (`LoggedModel`) does — or else one that ignores everything.

The observer travels in a context variable, as the current span does in
OpenTelemetry: the model port (`stream(request)`) has no room for it, and one
client serves many calls at once. It is set only while a call is opened (retries
happen before the first byte, never after), never while its deltas are read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

from service.core.masking import SecretMask


class CallObserver(Protocol):
    """Told what a provider does to open one call."""

    def request(
        self, url: str, headers: Mapping[str, str], body: Mapping[str, Any], secrets: SecretMask
    ) -> None:
        """The request about to be sent; `secrets` masks the secret values it holds."""
        ...

    def retry(self, attempt: int, delay: float, error: BaseException) -> None:
        """Attempt `attempt` failed with `error`; the next starts in `delay` seconds."""
        ...


class _Unobserved:
    """The observer when nobody observes: every report is dropped."""

    def request(
        self, url: str, headers: Mapping[str, str], body: Mapping[str, Any], secrets: SecretMask
    ) -> None:
        pass

    def retry(self, attempt: int, delay: float, error: BaseException) -> None:
        pass


_UNOBSERVED = _Unobserved()
_current: ContextVar[CallObserver | None] = ContextVar("agw_call_observer", default=None)


def current() -> CallObserver:
    """The observer of the call being opened in this task (one that drops all, if none)."""
    observer = _current.get()
    return observer if observer is not None else _UNOBSERVED


@contextmanager
def observing(observer: CallObserver) -> Iterator[None]:
    """Within the block, `observer` is told what the provider does to open its call."""
    token = _current.set(observer)
    try:
        yield
    finally:
        _current.reset(token)
