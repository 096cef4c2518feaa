"""Rendering a run's events for a person at a terminal.

Answer text streams as it arrives; reasoning streams dimmed after "[thinking]";
tool calls, their results, actions, the plan and its tasks get one line each.
The tools the service adds itself go by friendly names ("plan", "task report"): the
plan's lines show what they did, so their arguments and results are not repeated.
Live events (start/delta/end) and history replays (snapshots) render alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TextIO

from agw.v1 import events_pb2 as pb
from google.protobuf import json_format, struct_pb2

from agw_client.cli.spinner import Spinner
from agw_client.messages import from_value, plain_numbers

RESULT_WIDTH = 200
#: The tools the service adds itself, by the name a person reads.
FRIENDLY_NAMES = {
    "_plan_add_tasks_": "plan",
    "_plan_update_task_": "task report",
    "_plan_decide_": "replan",
    "_plan_verify_": "verify",
    "_context_summary_": "summary",
}


def display_name(name: str) -> str:
    """The name a tool is shown by: its friendly name for the service's own tools."""
    return FRIENDLY_NAMES.get(name, name)


TASK_MARK = {
    pb.TASK_STATUS_INIT: "[ ]",
    pb.TASK_STATUS_IN_PROGRESS: "[>]",
    pb.TASK_STATUS_COMPLETED: "[x]",
    pb.TASK_STATUS_FAILED: "[!]",
    pb.TASK_STATUS_CANCELED: "[-]",
}


@dataclass
class ToolCall:
    """A tool call (or action) as seen on the stream so far."""

    name: str = ""
    #: "backend", a frontend view type ("html", "qlc", "dqlc"), or "action".
    type: str = ""
    #: The JSON arguments, as much of them as arrived.
    arguments: str = ""
    description: str = ""
    #: The view's address, and the tool definition's static parameters.
    api: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    #: A frontend tool's answer: its JSON Schema, when the tool declares one.
    answer_schema: dict[str, Any] = field(default_factory=dict)


def struct_dict(struct: struct_pb2.Struct) -> dict[str, Any]:
    """A `Struct` as a plain dict, integral numbers as ints."""
    data: dict[str, Any] = plain_numbers(json_format.MessageToDict(struct))
    return data


class Style:
    """ANSI styling, or none when disabled."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def _wrap(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.enabled and text else text

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def red(self, text: str) -> str:
        return self._wrap("31", text)

    def cyan(self, text: str) -> str:
        return self._wrap("36", text)


def short(value: Any, width: int = RESULT_WIDTH) -> str:
    """A one-line rendering of a JSON value, cut at `width` characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


class Renderer:
    """Writes events to `out` (and failures to `err`) as they come."""

    def __init__(self, out: TextIO, err: TextIO, *, color: bool, history: bool = False) -> None:
        self.out, self.err = out, err
        self.style = Style(color)
        #: Whether to show the user's messages (history replays) rather than leave them to
        #: the prompt that typed them (live chats).
        self.history = history
        self._at_line_start = True
        self._tools: dict[str, ToolCall] = {}  # by tool (or action) id
        self._tasks: dict[str, int] = {}  # task id -> last shown status
        #: Turning until the first output (see `wait`).
        self.spinner: Spinner | None = None

    # Output primitives

    def wait(self) -> None:
        """Show a spinner until the next output, when the error stream is a terminal."""
        if self.err.isatty() and self.spinner is None:
            self.spinner = Spinner(self.err)
            self.spinner.start()

    def stop_spinner(self) -> None:
        if self.spinner is not None:
            self.spinner.stop()
            self.spinner = None

    def write(self, text: str) -> None:
        if text:
            self.stop_spinner()
            self.out.write(text)
            self.out.flush()
            self._at_line_start = text.endswith("\n")

    def line(self, text: str) -> None:
        """Write `text` on a line of its own."""
        self.write(("" if self._at_line_start else "\n") + text + "\n")

    def prompted(self) -> None:
        """A prompt was written to the terminal; the line is open until the user ends it."""
        self._at_line_start = False

    def typed_line(self) -> None:
        """The user ended a line on the terminal (their Enter after a prompt)."""
        self._at_line_start = True

    def end_line(self) -> None:
        if not self._at_line_start:
            self.write("\n")

    def notice(self, text: str) -> None:
        """A message about the session (not the run) on the error stream."""
        self.stop_spinner()
        self.end_line()
        self.err.write(text + "\n")
        self.err.flush()

    # Events

    def event(self, event: pb.Event) -> None:
        kind = event.WhichOneof("payload")
        handler = getattr(self, f"_on_{kind}", None) if kind else None
        if kind and handler is not None:
            handler(getattr(event, kind))

    def tool(self, tool_id: str) -> ToolCall:
        """The tool call (or action) `tool_id` as seen so far (empty when unseen)."""
        return self._tools.get(tool_id) or ToolCall()

    def plan_lines(self, plan: pb.Plan) -> list[str]:
        return [f"  {TASK_MARK.get(t.status, '[ ]')} {t.description}" for t in plan.tasks]

    def _on_request_query(self, p: pb.RequestQuery) -> None:
        if self.history:
            self.line(self.style.bold(f"you> {p.message}"))

    def _on_request_submit(self, p: pb.RequestSubmit) -> None:
        if self.history:
            self.line(self.style.dim(f"you answered: {short(from_value(p.payload))}"))

    def _on_reasoning_start(self, _: pb.ReasoningStart) -> None:
        self.end_line()
        self.write(self.style.dim("[thinking] "))

    def _on_reasoning_delta(self, p: pb.ReasoningDelta) -> None:
        self.write(self.style.dim(p.delta))

    def _on_reasoning_end(self, _: pb.ReasoningEnd) -> None:
        self.end_line()

    def _on_reasoning_snapshot(self, p: pb.ReasoningSnapshot) -> None:
        self.line(self.style.dim(f"[thinking] {p.text}"))

    def _on_content_start(self, _: pb.ContentStart) -> None:
        self.end_line()

    def _on_content_delta(self, p: pb.ContentDelta) -> None:
        self.write(p.delta)

    def _on_content_end(self, _: pb.ContentEnd) -> None:
        self.end_line()

    def _on_content_snapshot(self, p: pb.ContentSnapshot) -> None:
        self.line(p.text)

    def _on_tool_start(self, p: pb.ToolStart) -> None:
        self._tools[p.tool_id] = ToolCall(
            p.tool_name,
            p.tool_type,
            "",
            p.description,
            p.tool_api,
            struct_dict(p.tool_params),
            struct_dict(p.answer_schema),
        )

    def _on_tool_args(self, p: pb.ToolArgs) -> None:
        call = self._tools.setdefault(p.tool_id, ToolCall())
        call.arguments += p.delta

    def _on_tool_end(self, p: pb.ToolEnd) -> None:
        self._show_call(self.tool(p.tool_id).name, self.tool(p.tool_id).arguments)

    def _show_call(self, name: str, arguments: str) -> None:
        if name in FRIENDLY_NAMES:  # the plan's lines show what it does
            self.line(self.style.dim(f"→ {display_name(name)}"))
        else:
            self.line(self.style.cyan(f"→ {name} {short(arguments)}".rstrip()))

    def _on_tool_snapshot(self, p: pb.ToolSnapshot) -> None:
        self._tools[p.tool_id] = ToolCall(
            p.tool_name,
            p.tool_type,
            p.arguments,
            p.description,
            p.tool_api,
            struct_dict(p.tool_params),
        )
        self._show_call(p.tool_name, p.arguments)

    def _on_tool_result(self, p: pb.ToolResult) -> None:
        name = self.tool(p.tool_id).name or p.tool_id
        if name in FRIENDLY_NAMES and not p.error:
            return  # the plan's lines say what came of it
        verb = "failed" if p.error else "returned (cached)" if p.cached else "returned"
        shown = display_name(name)
        self.line(self.style.dim(f"← {shown} {verb}: {short(from_value(p.result))}"))

    def _on_action_start(self, p: pb.ActionStart) -> None:
        self._tools[p.action_id] = ToolCall(p.action_name, "action")

    def _on_action_param(self, p: pb.ActionParam) -> None:
        name = self.tool(p.action_id).name or "action"
        self.line(self.style.cyan(f"⚡ {name} {short(from_value(p.param))}"))

    def _on_action_snapshot(self, p: pb.ActionSnapshot) -> None:
        self.line(self.style.cyan(f"⚡ {p.action_name} {short(p.arguments)}".rstrip()))

    def _on_source_snapshot(self, p: pb.SourceSnapshot) -> None:
        self.line(self.style.dim(f"source: {p.title} {p.url}".rstrip()))

    def _on_plan_create(self, p: pb.PlanCreate) -> None:
        self._show_plan("plan:", p.plan)

    def _on_plan_revise(self, p: pb.PlanRevise) -> None:
        decision = pb.PlanDecision.Name(p.decision).removeprefix("PLAN_DECISION_").lower()
        self._show_plan(f"plan {decision}: {p.reason}".rstrip(": "), p.plan)

    def _on_plan_update(self, p: pb.PlanUpdate) -> None:
        done = sum(t.status == pb.TASK_STATUS_COMPLETED for t in p.plan.tasks)
        changed = [t for t in p.plan.tasks if self._tasks.get(t.task_id) != t.status]
        for task in changed:
            self._tasks[task.task_id] = task.status
            mark = TASK_MARK.get(task.status, "[ ]")
            self.line(self.style.dim(f"plan {done}/{len(p.plan.tasks)}: {mark} {task.description}"))

    def _show_plan(self, title: str, plan: pb.Plan) -> None:
        self._tasks = {t.task_id: t.status for t in plan.tasks}
        self.line(self.style.bold(title))
        for text in self.plan_lines(plan):
            self.line(text)

    def _on_task_start(self, p: pb.TaskStart) -> None:
        self.line(self.style.bold(f"▶ {p.description}"))

    def _on_task_complete(self, p: pb.TaskComplete) -> None:
        self.line(self.style.dim(f"✓ {p.description}".rstrip()))

    def _on_task_fail(self, p: pb.TaskFail) -> None:
        self.line(self.style.red(f"✗ task failed: {p.error.reason}: {p.error.message}"))

    def _on_loop_detect(self, p: pb.LoopDetect) -> None:
        self.line(self.style.dim(f"loop: {p.tool_name} repeated {p.repeat_count} times"))

    def _on_context_compress(self, p: pb.ContextCompress) -> None:
        before, after = p.messages_before, p.messages_after
        tokens = f"~{p.tokens_before} → ~{p.tokens_after} tokens"
        self.line(self.style.dim(f"context {p.strategy}: {before} → {after} messages, {tokens}"))

    def _on_permission_answer(self, p: pb.PermissionAnswer) -> None:
        verdict = "allowed" if p.allowed else "denied"
        self.line(self.style.dim(f"permission {verdict} ({p.reason})"))

    def _on_question_answer(self, p: pb.QuestionAnswer) -> None:
        if p.timed_out:
            self.line(self.style.dim("question timed out"))

    def _on_run_error(self, p: pb.RunError) -> None:
        self.end_line()
        self.err.write(self.style.red(f"error: {p.error.reason}: {p.error.message}") + "\n")
        self.err.flush()

    def _on_run_cancel(self, p: pb.RunCancel) -> None:
        self.notice(f"cancelled ({p.reason})")
