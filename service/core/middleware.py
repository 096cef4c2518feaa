"""Event middleware: an ordered pipeline that sees every run and every event.

A middleware has three hooks, all optional and all synchronous (they run
inline on the streaming path, so they add no buffering):

- `on_run_start(run)` — before the run's first event;
- `on_event(run, event)` — returns the event (possibly changed, or another
  event) to emit it, or None to drop it;
- `on_run_end(run, terminal)` — after the run's terminal event.

Middlewares run in order; each sees what the previous one returned. The run
keeps the stream's invariants whatever they do: a terminal event cannot be
dropped (the original is emitted), and the `*.end` of a dropped `*.start` is
dropped too. Configure them with `AGW_MIDDLEWARES` as a JSON list of
`"module:factory"` paths; each factory is called with the settings object.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from service.core.errors import InvalidRequest
from service.core.events import Event


@runtime_checkable
class Middleware(Protocol):
    """What a middleware may implement (every hook is optional). `run` is the run's
    `RunState` (service/core/run/state.py), which the hooks only read."""

    def on_event(self, run: Any, event: Event) -> Event | None: ...


def hooks(middlewares: Sequence[object], name: str) -> tuple[Callable[..., Any], ...]:
    """The bound `name` hooks of the middlewares that define it, in order."""
    return tuple(getattr(m, name) for m in middlewares if callable(getattr(m, name, None)))


def load_middlewares(paths: Sequence[str], settings: object) -> list[object]:
    """Instantiate `"module:factory"` paths with the settings; a bad path is a clear error."""
    loaded = []
    for path in paths:
        module_name, _, attribute = path.partition(":")
        if not module_name or not attribute:
            raise InvalidRequest(f"middleware {path!r}: expected 'module:factory'")
        try:
            factory = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as error:
            raise InvalidRequest(f"middleware {path!r}: {error}") from error
        loaded.append(factory(settings))
    return loaded
