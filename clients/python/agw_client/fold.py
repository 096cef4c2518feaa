"""Folding a run's events into what a caller usually wants: the answer, the tool calls, the plan.

    result = fold(events)            # or RunFolder().feed(event) as events arrive
    result.answer                    # text of the last answer block
    result.tool_calls                # [ToolCall(name="weather", arguments='{"city":"Paris"}', ...)]
    result.plan                      # the last plan, or None
    result.raise_for_outcome()       # RunFailed / RunCancelled unless the run completed

Live streams (`*.start`/`*.delta`/`*.end`) and history replays (`*.snapshot`,
as `GetChat` returns them) fold the same way. The events of a nested run (a
subagent called as a tool: they carry the call's id as `parent_tool_id`) fold
into that call's `nested` result, not into the run's own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agw.v1 import events_pb2 as pb

from agw_client.errors import RunCancelled, RunFailed
from agw_client.messages import from_value


@dataclass
class ToolCall:
    """One tool (or action) call of a run, with its result once it came."""

    tool_id: str
    name: str = ""
    #: "backend", a frontend view type ("html", "qlc", "dqlc"), or "action".
    type: str = ""
    #: The complete JSON arguments, as streamed by the model.
    arguments: str = ""
    #: The result fed back to the model (a plain JSON value), None until `tool.result`.
    result: Any = None
    error: bool = False
    #: Whether the result is the earlier one of an identical call, not executed again.
    cached: bool = False
    #: Whether `tool.result` (or `action.result`) arrived.
    done: bool = False
    task_id: str = ""
    #: What the nested run of this call produced, when the tool is an agent (a subagent).
    nested: RunResult | None = None

    @property
    def args(self) -> Any:
        """The arguments parsed as JSON (None when empty or not valid JSON)."""
        try:
            return json.loads(self.arguments) if self.arguments else None
        except json.JSONDecodeError:
            return None


@dataclass
class RunResult:
    """What one run produced."""

    run_id: str = ""
    chat_id: str = ""
    #: The answer blocks' texts in order (one per `content.start` or `content.snapshot`).
    contents: list[str] = field(default_factory=list)
    #: The reasoning blocks' texts in order.
    reasonings: list[str] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    #: The latest plan of the run (from plan.create / plan.update / plan.revise), if any.
    plan: pb.Plan | None = None
    #: "complete", "error", "cancel", or "" while the run has not ended.
    outcome: str = ""
    finish_reason: str = ""
    usage: pb.Usage | None = None
    error: pb.ErrorDetail | None = None
    cancel_reason: str = ""

    @property
    def answer(self) -> str:
        """The final answer: the text of the last answer block ("" when there is none)."""
        return self.contents[-1] if self.contents else ""

    @property
    def text(self) -> str:
        """Every answer block, joined by blank lines."""
        return "\n\n".join(self.contents)

    @property
    def reasoning(self) -> str:
        return "\n\n".join(self.reasonings)

    def raise_for_outcome(self) -> RunResult:
        """Raise `RunFailed` or `RunCancelled` unless the run completed; return self."""
        if self.outcome == "error":
            error = self.error or pb.ErrorDetail()
            metadata = dict(error.metadata)
            raise RunFailed(
                error.message, reason=error.reason, metadata=metadata, run_id=self.run_id
            )
        if self.outcome == "cancel":
            raise RunCancelled(self.cancel_reason, run_id=self.run_id)
        return self


class RunFolder:
    """Folds events one at a time into a `RunResult`."""

    def __init__(self) -> None:
        self.result = RunResult()
        self._blocks: dict[str, tuple[list[str], int]] = {}  # block id -> (texts, index)
        self._calls: dict[str, ToolCall] = {}
        self._nested: dict[str, RunFolder] = {}  # calling tool id -> its nested run's folder
        self._every_call: dict[str, ToolCall] = {}  # of this run and its nested runs, by id

    def feed(self, event: pb.Event) -> RunResult:
        """Take one event into account; returns the result so far."""
        result = self.result
        result.run_id = result.run_id or event.run_id
        result.chat_id = result.chat_id or event.chat_id
        if event.parent_tool_id:
            self._nested_folder(event.parent_tool_id)._fold(event)
        else:
            self._fold(event)
        return result

    def _nested_folder(self, tool_id: str) -> RunFolder:
        folder = self._nested.get(tool_id)
        if folder is None:
            folder = self._nested[tool_id] = RunFolder()
            folder._every_call = self._every_call
            folder.result.run_id, folder.result.chat_id = self.result.run_id, self.result.chat_id
            call = self._every_call.get(tool_id)
            if call is not None:
                call.nested = folder.result
        return folder

    def _fold(self, event: pb.Event) -> None:
        """Take one event of this (possibly nested) run into account."""
        kind = event.WhichOneof("payload")
        handler = getattr(self, f"_on_{kind}", None) if kind else None
        if kind and handler is not None:
            handler(event, getattr(event, kind))

    def _start_block(self, texts: list[str], block_id: str, text: str = "") -> None:
        texts.append(text)
        self._blocks[block_id] = (texts, len(texts) - 1)

    def _append(self, block_id: str, delta: str) -> None:
        if block_id in self._blocks:
            texts, index = self._blocks[block_id]
            texts[index] += delta

    def _on_reasoning_start(self, _: pb.Event, p: pb.ReasoningStart) -> None:
        self._start_block(self.result.reasonings, p.reasoning_id)

    def _on_reasoning_delta(self, _: pb.Event, p: pb.ReasoningDelta) -> None:
        self._append(p.reasoning_id, p.delta)

    def _on_reasoning_snapshot(self, _: pb.Event, p: pb.ReasoningSnapshot) -> None:
        self._start_block(self.result.reasonings, p.reasoning_id, p.text)

    def _on_content_start(self, _: pb.Event, p: pb.ContentStart) -> None:
        self._start_block(self.result.contents, p.content_id)

    def _on_content_delta(self, _: pb.Event, p: pb.ContentDelta) -> None:
        self._append(p.content_id, p.delta)

    def _on_content_snapshot(self, _: pb.Event, p: pb.ContentSnapshot) -> None:
        self._start_block(self.result.contents, p.content_id, p.text)

    def _call(self, call_id: str, event: pb.Event) -> ToolCall:
        if call_id not in self._calls:
            self._calls[call_id] = ToolCall(tool_id=call_id, task_id=event.task_id)
            self._every_call[call_id] = self._calls[call_id]
            self.result.tool_calls.append(self._calls[call_id])
        return self._calls[call_id]

    def _on_tool_start(self, e: pb.Event, p: pb.ToolStart) -> None:
        call = self._call(p.tool_id, e)
        call.name, call.type = p.tool_name, p.tool_type

    def _on_tool_args(self, e: pb.Event, p: pb.ToolArgs) -> None:
        self._call(p.tool_id, e).arguments += p.delta

    def _on_tool_snapshot(self, e: pb.Event, p: pb.ToolSnapshot) -> None:
        call = self._call(p.tool_id, e)
        call.name, call.type, call.arguments = p.tool_name, p.tool_type, p.arguments

    def _on_tool_result(self, e: pb.Event, p: pb.ToolResult) -> None:
        call = self._call(p.tool_id, e)
        call.result, call.error, call.done = from_value(p.result), p.error, True
        call.cached = p.cached

    def _on_action_start(self, e: pb.Event, p: pb.ActionStart) -> None:
        call = self._call(p.action_id, e)
        call.name, call.type = p.action_name, "action"

    def _on_action_args(self, e: pb.Event, p: pb.ActionArgs) -> None:
        self._call(p.action_id, e).arguments += p.delta

    def _on_action_snapshot(self, e: pb.Event, p: pb.ActionSnapshot) -> None:
        call = self._call(p.action_id, e)
        call.name, call.type, call.arguments = p.action_name, "action", p.arguments

    def _on_action_result(self, e: pb.Event, p: pb.ActionResult) -> None:
        call = self._call(p.action_id, e)
        call.result, call.done = from_value(p.result), True

    def _on_plan_create(self, _: pb.Event, p: pb.PlanCreate) -> None:
        self.result.plan = p.plan

    def _on_plan_update(self, _: pb.Event, p: pb.PlanUpdate) -> None:
        self.result.plan = p.plan

    def _on_plan_revise(self, _: pb.Event, p: pb.PlanRevise) -> None:
        self.result.plan = p.plan

    def _on_run_complete(self, _: pb.Event, p: pb.RunComplete) -> None:
        self.result.outcome, self.result.finish_reason = "complete", p.finish_reason
        self.result.usage = p.usage if p.HasField("usage") else None

    def _on_run_error(self, _: pb.Event, p: pb.RunError) -> None:
        self.result.outcome, self.result.error = "error", p.error

    def _on_run_cancel(self, _: pb.Event, p: pb.RunCancel) -> None:
        self.result.outcome, self.result.cancel_reason = "cancel", p.reason


def fold(events: Iterable[pb.Event]) -> RunResult:
    """Fold the events of one run into a `RunResult`."""
    folder = RunFolder()
    for event in events:
        folder.feed(event)
    return folder.result


def fold_runs(events: Iterable[pb.Event]) -> list[RunResult]:
    """Fold a chat's history (several runs, e.g. `GetChat().events`) into one result per run."""
    folders: dict[str, RunFolder] = {}
    for event in events:
        if event.run_id:
            folders.setdefault(event.run_id, RunFolder()).feed(event)
    return [folder.result for folder in folders.values()]


def final_answer(events: Iterable[pb.Event]) -> str:
    """The text of the run's last answer block."""
    return fold(events).answer


def tool_calls(events: Iterable[pb.Event]) -> list[ToolCall]:
    """The run's tool and action calls, in the order they started."""
    return fold(events).tool_calls


def plan(events: Iterable[pb.Event]) -> pb.Plan | None:
    """The run's latest plan, or None."""
    return fold(events).plan
