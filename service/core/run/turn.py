"""One model turn: stream a model call into events, one event per upstream delta.

`stream_turn` opens the provider stream, forwards every delta at once as the
matching event (reasoning, content, tool-call fragments) and returns what the
turn produced, for the mode to act on and for the chat memory. The run's own turn
lets its readers write out its first output before it goes on with the rest of what
it read (`EventLog.hand_on`). A text block
(reasoning or content) closes when the kind of output changes; tool-call blocks
stay open until the stream ends, so fragments of parallel calls may interleave. Leaving
the function — normally, by error or by cancellation — closes the upstream
request; blocks still open are closed by the run's `finish`. A call that starts over on
another deployment of its model alias after it had streamed (`ModelDelta.restart`) has
its open blocks closed, a `model.fallback` said, and its output so far dropped.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from service.core import events
from service.core.model import ModelClient, ModelRequest, Restart
from service.core.run.eventlog import Emitter, EventLog
from service.core.run.observation import ModelCallObserver
from service.core.run.results import ToolCall, TurnResult
from service.core.run.state import RunState
from service.core.tools.definitions import ToolDefinition

#: Gives the event id of a tool call from its name and the model's tool_call_id.
ToolIdFactory = Callable[[str, str], str]


def backend_tool_id(name: str, upstream_id: str) -> str:
    """Backend tool calls keep the model's own tool_call_id."""
    return upstream_id or "call_" + secrets.token_hex(12)


class Ids:
    """Per-run counters of the block ids `{runId}_r_{n}` (reasoning) and `{runId}_c_{n}`.

    A resumed run's counters start after the ids its journaled events used (`floors`:
    the highest n of each id prefix), so that a step run again opens new blocks.
    """

    __slots__ = ("content", "reasoning", "run_id")

    def __init__(self, run_id: str, floors: Mapping[str, int] | None = None) -> None:
        self.run_id = run_id
        self.reasoning = floors.get(f"{run_id}_r_", 0) if floors else 0
        self.content = floors.get(f"{run_id}_c_", 0) if floors else 0

    def next_reasoning(self) -> str:
        self.reasoning += 1
        return f"{self.run_id}_r_{self.reasoning}"

    def next_content(self) -> str:
        self.content += 1
        return f"{self.run_id}_c_{self.content}"


def new_msg_id() -> str:
    return "m_" + secrets.token_hex(4)


def frontend_tool_id() -> str:
    return "t_" + secrets.token_hex(4)


def action_id() -> str:
    return "a_" + secrets.token_hex(4)


def _start_call(
    emit: Callable[[events.Event], events.Event],
    name: str,
    upstream: str,
    tools: Mapping[str, ToolDefinition] | None,
    tool_id: ToolIdFactory,
) -> ToolCall:
    """Open the block of a new tool call, by the kind of the tool it names."""
    definition = tools.get(name) if tools is not None else None
    if definition is None:  # not offered: streams as a backend call, its result is an error
        call = ToolCall(tool_id(name, upstream), name, upstream_id=upstream)
        emit(events.tool_start(call.id, name))
        return call
    if definition.kind == "action":
        call = ToolCall(action_id(), name, upstream_id=upstream, kind="action")
        emit(events.action_start(call.id, name, definition.description))
        return call
    if definition.kind == "frontend":
        call = ToolCall(frontend_tool_id(), name, upstream_id=upstream, kind="frontend")
    else:
        call = ToolCall(tool_id(name, upstream), name, upstream_id=upstream)
    emit(events.tool_start(call.id, name, definition.view_type, **definition.start_fields()))
    return call


def _close_text(
    emit: Callable[[events.Event], events.Event], kind: str, block_id: str, emit_content: bool
) -> str:
    """Close the open text block of `kind` ("reasoning", "content" or none) with id
    `block_id`; the kind open then: none."""
    if kind == "reasoning":
        emit(events.reasoning_end(block_id))
    elif kind == "content" and emit_content:
        emit(events.content_end(block_id))
    return ""


def _restart(
    restart: Restart,
    emit: Callable[[events.Event], events.Event],
    observer: ModelCallObserver,
    calls: dict[int, ToolCall],
    result: TurnResult,
    reasoning: list[str],
    content: list[str],
) -> None:
    """The call starts over elsewhere: its tool blocks are closed (its text block is
    already), its output so far void."""
    for call in calls.values():
        emit(events.action_end(call.id) if call.kind == "action" else events.tool_end(call.id))
    observer.restarted(restart)
    reasoning.clear()
    content.clear()
    calls.clear()
    result.signatures.clear()
    result.finish_reason, result.usage = "", None
    result.reasoning_id = result.content_id = ""


async def stream_turn(
    run: RunState,
    out: Emitter,
    ids: Ids,
    client: ModelClient,
    request: ModelRequest,
    *,
    tool_id: ToolIdFactory = backend_tool_id,
    emit_content: bool = True,
    emit_reasoning: bool = True,
    tools: Mapping[str, ToolDefinition] | None = None,
) -> TurnResult:
    """Run one streaming model call, emitting its events as the deltas arrive.

    With `emit_content=False` the answer text is collected but not streamed
    (used for an internal first candidate); reasoning and tool calls still stream.
    With `emit_reasoning=False` the reasoning is collected in `hidden_reasoning`
    only. `tools` (the offered tools by name) decides how a call streams: a
    frontend tool as `tool.*` with a `t_` id and its view type, an action as
    `action.*` with an `a_` id; any other call as a backend `tool.*` with the
    model's tool_call_id.
    """
    # A scope without ids of its own adds nothing to an event: append straight to the log.
    emit = out.emit if out.task_id or out.parent_tool_id else out.log.emit
    result = TurnResult(msg_id=new_msg_id(), task_id=out.task_id, parent_tool_id=out.parent_tool_id)
    reasoning: list[str] = []
    content: list[str] = []
    open_kind = ""  # the open text block: "reasoning" | "content" | ""
    open_id = ""
    calls: dict[int, ToolCall] = {}
    started = time.monotonic()
    # (No closures here: their cells and functions would be held for as long as the turn
    # streams.)
    observer = ModelCallObserver(run, out, request)
    error: BaseException | None = None
    log = out.log
    try:
        stream = client.stream(request)  # a client routing calls reports its first attempt
        observer.opened()
        async with stream as deltas:
            # Until the turn's first output is out: then -1. A plan task's or a nested run's
            # turn shares the loop with the others running at once: it does not hold back.
            shown = -1 if out.task_id or out.parent_tool_id else len(log)
            async for delta in deltas:
                if delta.restart is not None:
                    open_kind = _close_text(emit, open_kind, open_id, emit_content)
                    _restart(delta.restart, emit, observer, calls, result, reasoning, content)
                    continue
                if result.first_delta_ms is None:
                    result.first_delta_ms = (time.monotonic() - started) * 1000
                if delta.reasoning and not emit_reasoning:
                    reasoning.append(delta.reasoning)
                elif delta.reasoning:
                    if open_kind != "reasoning":
                        _close_text(emit, open_kind, open_id, emit_content)
                        open_kind, open_id = "reasoning", ids.next_reasoning()
                        result.reasoning_id = result.reasoning_id or open_id
                        emit(events.reasoning_start(open_id))
                    reasoning.append(delta.reasoning)
                    emit(events.reasoning_delta(open_id, delta.reasoning))
                if delta.content:
                    if open_kind != "content":
                        _close_text(emit, open_kind, open_id, emit_content)
                        open_kind = "content"
                        if emit_content:  # hidden text gets no id
                            open_id = ids.next_content()
                            result.content_id = result.content_id or open_id
                            emit(events.content_start(open_id))
                    content.append(delta.content)
                    if emit_content:
                        emit(events.content_delta(open_id, delta.content))
                for fragment in delta.tool_calls:
                    call = calls.get(fragment.index)
                    if call is None:
                        open_kind = _close_text(emit, open_kind, open_id, emit_content)
                        call = calls[fragment.index] = _start_call(
                            emit, fragment.name or "", fragment.id or "", tools, tool_id
                        )
                    if fragment.arguments:
                        call.arguments += fragment.arguments
                        if call.kind == "action":
                            emit(events.action_args(call.id, fragment.arguments, call.chunks))
                        else:
                            emit(events.tool_args(call.id, fragment.arguments, call.chunks))
                        call.chunks += 1
                if delta.finish_reason:
                    result.finish_reason = delta.finish_reason
                if delta.usage is not None:
                    result.usage = delta.usage
                if delta.signatures:
                    result.signatures += delta.signatures
                if shown >= 0 and len(log) > shown:  # the turn's first output: its readers
                    shown = -1  # take it before the rest of the chunk is read
                    await log.hand_on()
        _close_text(emit, open_kind, open_id, emit_content)
        for call in calls.values():  # parallel calls stay open until the turn's stream ends
            emit(events.action_end(call.id) if call.kind == "action" else events.tool_end(call.id))
    except BaseException as exc:
        error = exc
        raise
    finally:  # also on failure: a partial answer is kept in the chat's memory
        result.tool_calls = [call for _, call in sorted(calls.items())]
        if emit_reasoning:
            result.reasoning = "".join(reasoning)
        else:
            result.hidden_reasoning = "".join(reasoning)
        result.content = "".join(content)
        result.duration_ms = (time.monotonic() - started) * 1000
        observer.end(
            finish_reason=result.finish_reason,
            usage=result.usage,
            first_delta_ms=result.first_delta_ms,
            output=result.content
            or json.dumps([{"name": c.name, "arguments": c.arguments} for c in calls.values()]),
            error=error,
        )
        result.cost = observer.cost
        run.turn_finished(request, result)
    return result


def turn_step(
    run: RunState,
    out: Emitter,
    request: ModelRequest,
    stream: Callable[[], Awaitable[TurnResult]],
) -> Awaitable[TurnResult]:
    """The model turn `stream()` makes with `request`, as a step of the run
    (service/core/run/journal.py): a journaled turn is given back, its call counted in the
    run's usage, and not streamed again. To be awaited at once (it adds no frame)."""
    codec = _TurnCodec(run, request, out.log, run.context_summary)
    return out.step("turn", stream, codec.encode, codec.decode)


class _TurnCodec:
    """How a model turn is journaled (`encode`) and given back (`decode`): one small object
    per turn rather than two closures and their cells, held while the turn streams."""

    __slots__ = ("log", "request", "run", "start", "summary")

    def __init__(
        self, run: RunState, request: ModelRequest, log: EventLog, summary: dict[str, str] | None
    ) -> None:
        self.run = run
        self.request = request
        self.log = log
        self.start = len(log)
        self.summary = summary  # made before this turn: its record will carry it

    def encode(self, turn: TurnResult) -> dict[str, Any]:
        messages = self.request.messages
        system = messages[0].get("content") if messages and messages[0]["role"] == "system" else ""
        return {
            "turn": turn.to_json(),
            "stage": self.request.stage,
            "system": system or "",
            "start": self.start,
            "end": len(self.log),
            "summary": self.summary,
        }

    def decode(self, data: dict[str, Any]) -> TurnResult:
        turn = TurnResult.from_json(data["turn"])
        self.run.accounting.add_call(turn.usage, turn.cost)
        return turn


@dataclass(frozen=True, slots=True)
class JournaledTurn:
    """A model turn as a run's journal keeps it (`turn_step`): what the chat recorder of a
    resumed run is told of it again."""

    result: TurnResult
    stage: str
    system: str
    start: int  # the run's log length when the turn began,
    end: int  # and when it ended
    summary: dict[str, str] | None  # a summary of the chat's memory made just before it

    def request(self) -> ModelRequest:
        """As much of its request as the recorder reads: its stage and system prompt."""
        messages = [{"role": "system", "content": self.system}] if self.system else []
        return ModelRequest(provider="", model="", messages=messages, stage=self.stage)


def journaled_turns(steps: Mapping[str, Any]) -> list[JournaledTurn]:
    """The model turns among a run's journaled steps, in the order they were journaled."""
    return [
        JournaledTurn(
            TurnResult.from_json(data["turn"]),
            data["stage"],
            data["system"],
            data["start"],
            data["end"],
            data.get("summary"),
        )
        for data in steps.values()
        if isinstance(data, dict) and "turn" in data
    ]
