"""What a backend tool reports while it runs: `tool.progress` events between its `tool.end`
and its `tool.result`, and the files it wrote (`file.create`, `file.update`).

A tool implementation gets a `Progress` in its `ToolCallInfo.progress` and calls it
with a message (a line of output: `_bash_` sends each line of its command's stdout and
stderr) and/or numbers (an MCP server's progress notifications: progress and total).
Each call is one event, emitted at once. A call reports at most `MAX_EVENTS` of them
(the last one says that the rest is not shown) and each message is cut to
`MAX_MESSAGE_CHARS`; the tool's result is what the model reads, never its progress.

A tool that writes in the chat's workspace announces each file a call created or changed
(`FileNotices`), at most `MAX_FILE_EVENTS` per call.
"""

from __future__ import annotations

import math

from service.core import events
from service.core.run.eventlog import Emitter

#: The most `tool.progress` events one call emits (the last one notes the cut).
MAX_EVENTS = 500
#: The longest message of one event; a longer one is cut and marked.
MAX_MESSAGE_CHARS = 2000
CUT_NOTE = "… (further progress of this call is not shown)"


class Progress:
    """Reports the progress of one tool call on its run's stream."""

    __slots__ = ("_emitted", "out", "tool_id")

    def __init__(self, out: Emitter, tool_id: str) -> None:
        self.out = out
        self.tool_id = tool_id
        self._emitted = 0

    def __call__(
        self,
        message: str = "",
        *,
        progress: float | None = None,
        total: float | None = None,
        stream: str = "progress",
    ) -> None:
        """Emit one `tool.progress` (nothing once the run ended or the cap is reached)."""
        if self.out.done or self._emitted > MAX_EVENTS:
            return
        self._emitted += 1
        if self._emitted > MAX_EVENTS:
            self.out.emit(events.tool_progress(self.tool_id, CUT_NOTE, stream=stream))
            return
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[:MAX_MESSAGE_CHARS] + "… (cut)"
        self.out.emit(
            events.tool_progress(
                self.tool_id,
                message,
                progress=_number(progress),
                total=_number(total),
                stream=stream,
            )
        )


#: The most `file.create`/`file.update` events one call emits (the files are all listed by
#: ListFiles whatever their number).
MAX_FILE_EVENTS = 100


class FileNotices:
    """Announces the files one tool call wrote: `file.create`, `file.update`."""

    __slots__ = ("_emitted", "out", "tool_id")

    def __init__(self, out: Emitter, tool_id: str) -> None:
        self.out = out
        self.tool_id = tool_id
        self._emitted = 0

    def __call__(self, path: str, size_bytes: int, mime_type: str, *, created: bool) -> None:
        if self.out.done or self._emitted >= MAX_FILE_EVENTS:
            return
        self._emitted += 1
        kind = "file_create" if created else "file_update"
        self.out.emit(
            events.make(
                kind, tool_id=self.tool_id, path=path, size_bytes=size_bytes, mime_type=mime_type
            )
        )


def _number(value: float | None) -> float | None:
    """A finite number, or None (a NaN or infinity is not reported)."""
    if value is None or isinstance(value, bool):
        return None
    number = float(value)
    return number if math.isfinite(number) else None
