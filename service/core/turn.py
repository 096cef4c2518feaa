"""One model turn: stream a model call into events, one event per upstream delta.

`stream_turn` opens the provider stream, forwards every delta at once as the
matching event (reasoning, content, tool-call fragments) and returns what the
turn produced, for the mode to act on and for the chat memory. A text block
(reasoning or content) closes when the kind of output changes; tool-call blocks
stay open until the stream ends, so fragments of parallel calls may interleave. Leaving
the function — normally, by error or by cancellation — closes the upstream
request; blocks still open are closed by the run's `finish`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from service.core import events
from service.core.model import ModelClient, ModelRequest, Usage
from service.core.run import Run


@dataclass(slots=True)
class ToolCall:
    """A complete tool call of a turn."""

    id: str
    name: str
    arguments: str = ""
    upstream_id: str = ""


@dataclass(slots=True)
class TurnResult:
    """What one model turn produced."""

    msg_id: str
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = ""
    usage: Usage | None = None
    reasoning_id: str = ""
    content_id: str = ""
    first_delta_ms: float | None = None
    duration_ms: float = 0.0


#: Gives the event id of a tool call from its name and the model's tool_call_id.
ToolIdFactory = Callable[[str, str], str]


def backend_tool_id(name: str, upstream_id: str) -> str:
    """Backend tool calls keep the model's own tool_call_id."""
    return upstream_id or "call_" + secrets.token_hex(12)


class Ids:
    """Per-run counters of the block ids `{runId}_r_{n}` (reasoning) and `{runId}_c_{n}`."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.reasoning = 0
        self.content = 0

    def next_reasoning(self) -> str:
        self.reasoning += 1
        return f"{self.run_id}_r_{self.reasoning}"

    def next_content(self) -> str:
        self.content += 1
        return f"{self.run_id}_c_{self.content}"


def new_msg_id() -> str:
    return "m_" + secrets.token_hex(4)


async def stream_turn(
    run: Run,
    ids: Ids,
    client: ModelClient,
    request: ModelRequest,
    *,
    tool_id: ToolIdFactory = backend_tool_id,
    emit_content: bool = True,
) -> TurnResult:
    """Run one streaming model call, emitting its events as the deltas arrive.

    With `emit_content=False` the answer text is collected but not streamed
    (used for an internal first candidate); reasoning and tool calls still stream.
    """
    emit = run.emit
    result = TurnResult(msg_id=new_msg_id())
    reasoning: list[str] = []
    content: list[str] = []
    open_kind = ""  # the open text block: "reasoning" | "content" | ""
    open_id = ""
    calls: dict[int, ToolCall] = {}
    chunks: dict[int, int] = {}
    started = time.monotonic()

    def close_text() -> None:
        nonlocal open_kind
        if open_kind == "reasoning":
            emit(events.reasoning_end(open_id))
        elif open_kind == "content" and emit_content:
            emit(events.content_end(open_id))
        open_kind = ""

    async with client.stream(request) as deltas:
        async for delta in deltas:
            if result.first_delta_ms is None:
                result.first_delta_ms = (time.monotonic() - started) * 1000
            if delta.reasoning:
                if open_kind != "reasoning":
                    close_text()
                    open_kind, open_id = "reasoning", ids.next_reasoning()
                    result.reasoning_id = result.reasoning_id or open_id
                    emit(events.reasoning_start(open_id))
                reasoning.append(delta.reasoning)
                emit(events.reasoning_delta(open_id, delta.reasoning))
            if delta.content:
                if open_kind != "content":
                    close_text()
                    open_kind, open_id = "content", ids.next_content()
                    result.content_id = result.content_id or open_id
                    if emit_content:
                        emit(events.content_start(open_id))
                content.append(delta.content)
                if emit_content:
                    emit(events.content_delta(open_id, delta.content))
            for fragment in delta.tool_calls:
                call = calls.get(fragment.index)
                if call is None:
                    close_text()
                    name, upstream = fragment.name or "", fragment.id or ""
                    call = ToolCall(tool_id(name, upstream), name, upstream_id=upstream)
                    calls[fragment.index] = call
                    chunks[fragment.index] = 0
                    emit(events.tool_start(call.id, name))
                if fragment.arguments:
                    call.arguments += fragment.arguments
                    emit(events.tool_args(call.id, fragment.arguments, chunks[fragment.index]))
                    chunks[fragment.index] += 1
            if delta.finish_reason:
                result.finish_reason = delta.finish_reason
            if delta.usage is not None:
                result.usage = delta.usage
    close_text()
    result.tool_calls = [calls[i] for i in sorted(calls)]
    for call in calls.values():  # parallel calls stay open until the turn's stream ends
        emit(events.tool_end(call.id))
    result.reasoning = "".join(reasoning)
    result.content = "".join(content)
    result.duration_ms = (time.monotonic() - started) * 1000
    return result
