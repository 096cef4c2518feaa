"""Middlewares loaded by path in the tests (`AGW_MIDDLEWARES`)."""

from __future__ import annotations

from typing import Any

from agw.v1 import events_pb2 as pb

CALLS: list[tuple[str, str]] = []


class Redact:
    """Rewrites every answer fragment: 'secret' becomes '******'."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def on_event(self, run: Any, event: pb.Event) -> pb.Event | None:
        if event.WhichOneof("payload") == "content_delta":
            event.content_delta.delta = event.content_delta.delta.replace("secret", "******")
        return event


class DropReasoning:
    """Hides the model's reasoning, and records the run hooks."""

    def __init__(self, settings: Any) -> None:
        pass

    def on_run_start(self, run: Any) -> None:
        CALLS.append(("start", run.run_id))

    def on_event(self, run: Any, event: pb.Event) -> pb.Event | None:
        return None if event.type.startswith("reasoning.") else event

    def on_run_end(self, run: Any, terminal: pb.Event) -> None:
        CALLS.append(("end", terminal.type))


class DropEverything:
    """Tries to drop every event, the terminal one included."""

    def __init__(self, settings: Any) -> None:
        pass

    def on_event(self, run: Any, event: pb.Event) -> pb.Event | None:
        return None


def redact(settings: Any) -> Redact:
    return Redact(settings)
