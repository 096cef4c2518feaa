"""Executes the tool calls of a model turn and emits their results.

Per call: the JSON arguments are parsed and their templates rendered, then by
kind — a backend tool runs its implementation under its time-out; a frontend tool
waits for `Submit` (or its time-out); an action emits `action.param` and is
answered `"OK"` at once. Whatever goes wrong with one call (invalid arguments, a
tool that raises or times out, no answer in time) becomes that call's error
result, fed back to the model: the run goes on. Cancellation is never swallowed.
Calls of one turn run concurrently; results are emitted as they come and
returned in call order. The outside sources of the offered tools (MCP servers,
HTTP endpoints) are described once per run by `source.snapshot` (`describe_sources`).

Repeated calls, in this order. Every call (same tool, same arguments once parsed and
re-serialised with sorted keys) is first counted by the run's `LoopDetector`: the
third identical call within the last ten is a doom loop (`loop.detect`). Without
`loopDetect.ask` it is refused; with it the user is asked (`question.ask`, choices
stop / continue / skip, answered by `Submit`): skip — or no answer in time — refuses
the call, continue lets it go on as if no loop had been seen, stop refuses it and ends
the run (`run.complete`, finish reason `loop_stopped`, through `RunStopped`). A call
that goes on is then looked up in the run's cache: a backend tool declared
`cacheable` that already answered an identical call without error in this run is not
executed again — its earlier result is given, with `tool.result.cached` set. So with a
cacheable tool the first call runs, the second is answered from the cache, the third
is the loop.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import StatusCode

from service.core import events
from service.core.errors import AgwError
from service.core.run import observation, permissions, questions
from service.core.run.eventlog import Emitter
from service.core.run.journal import INTERRUPTED
from service.core.run.observation import observe_tool
from service.core.run.progress import FileNotices, Progress
from service.core.run.results import ToolCall
from service.core.run.state import RunState
from service.core.run.waits import Waits, WaitTimedOut
from service.core.tools.definitions import ToolDefinition, ToolError
from service.core.tools.guards import LoopDetector, identity, loop_message, truncate_output
from service.core.tools.registry import ToolCallInfo, ToolHandler, ToolRegistry
from service.core.tools.templates import ResultMemory, TemplateError, has_templates, render

log = logging.getLogger("agw.tools")

ACTION_RESULT = "OK"
LOOP_STOP, LOOP_CONTINUE, LOOP_SKIP = "stop", "continue", "skip"
LOOP_CHOICES = (
    questions.Option(LOOP_CONTINUE, "Let the call go on anyway."),
    questions.Option(LOOP_SKIP, "Refuse this call; the agent goes on.", recommended=True),
    questions.Option(LOOP_STOP, "End the run now."),
)
LOOP_STOPPED = "loop_stopped"  # the finish reason of a run the user stopped at a loop


@dataclass(slots=True)
class ToolOutcome:
    """The result of one call, as emitted and as fed back to the model."""

    call: ToolCall
    result: Any
    error: bool = False
    duration_ms: float = 0.0
    cached: bool = False  # the earlier result of an identical call, not executed again
    stop: bool = False  # the user chose to stop the run at this call (a loop)

    def message(self) -> dict[str, Any]:
        """The `tool` message that answers the call."""
        content = self.result if isinstance(self.result, str) else _json(self.result)
        return {
            "role": "tool",
            "tool_call_id": self.call.ref,
            "name": self.call.name,
            "content": content,
        }


class ToolExecutor:
    """Runs the tool calls of one run."""

    __slots__ = (
        "agent_key",
        "ask_on_loop",
        "cache",
        "delegates",
        "described",
        "loops",
        "memory",
        "out",
        "permission",
        "registry",
        "rendered",
        "run",
        "waits",
    )

    def __init__(
        self,
        run: RunState,
        out: Emitter,
        registry: ToolRegistry,
        waits: Waits,
        permission: Callable[[str], str] = lambda _name: "ALLOW",
        *,
        agent_key: str = "",
    ) -> None:
        self.run = run
        self.out = out
        self.registry = registry
        self.waits = waits
        self.permission = permission
        self.agent_key = agent_key
        # Backend tools the run implements itself (its subagents), by their definition's
        # `source`, which no tool source uses: these run instead of the registry's.
        self.delegates: dict[str, ToolHandler] = {}
        self.memory = ResultMemory()
        # Arguments whose templates were rendered, by call id, until the call's result is
        # emitted with them (shared by the scoped copies, like the memory).
        self.rendered: dict[str, str] = {}
        self.loops = LoopDetector()
        self.ask_on_loop = False  # ask the user what to do with a loop (agent `loopDetect.ask`)
        self.cache: dict[tuple[str, str], Any] = {}  # results of cacheable calls of the run
        # Origins described by source.snapshot in this run (as dict keys: lighter than a set).
        self.described: dict[str, None] = {}

    def scoped(self, out: Emitter) -> ToolExecutor:
        """This executor emitting through `out` (a task's scope), sharing its memory."""
        scoped = copy.copy(self)
        scoped.out = out
        return scoped

    def describe_sources(self, tools: Iterable[ToolDefinition]) -> None:
        """Emit `source.snapshot` for each origin of `tools` not yet described in this run."""
        for tool in tools:
            origin = tool.origin
            if origin is None or origin.source_id in self.described:
                continue
            self.described[origin.source_id] = None
            self.out.emit(
                events.make(
                    "source_snapshot",
                    source_id=origin.source_id,
                    title=origin.title,
                    url=origin.url,
                    icon=origin.icon,
                )
            )

    async def execute(
        self, calls: Sequence[ToolCall], tools: Mapping[str, ToolDefinition]
    ) -> list[ToolOutcome]:
        """Execute `calls` concurrently; their outcomes, in call order."""
        if len(calls) == 1:
            return [await self.execute_one(calls[0], tools)]
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(self.execute_one(call, tools)) for call in calls]
        return [task.result() for task in tasks]

    async def execute_one(self, call: ToolCall, tools: Mapping[str, ToolDefinition]) -> ToolOutcome:
        started = time.monotonic()
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
            "agw.tool.kind": call.kind,
        }
        with observation.span(f"execute_tool {call.name}", attributes=attributes) as span:
            try:
                key = identity(call.name, call.arguments)
                repeats = self.loops.check(key)
                if repeats:
                    self.out.emit(events.loop_detect(call.name, call.arguments, repeats))
                    decision = await self._loop_decision(call) if self.ask_on_loop else LOOP_SKIP
                    if decision == LOOP_STOP:
                        raise _Stopped("not executed: the user stopped the run")
                    if decision != LOOP_CONTINUE:
                        raise ToolError(loop_message(call.name, repeats))
                outcome = await self._answer(call, key, tools)
            except _Stopped as stopped:
                outcome = ToolOutcome(call, f"Error: {stopped}", error=True, stop=True)
            except ToolError as error:
                outcome = ToolOutcome(call, f"Error: {error}", error=True)
                span.set_status(StatusCode.ERROR, str(error)[:200])
            outcome.duration_ms = (time.monotonic() - started) * 1000
            self.report(outcome)
            observe_tool(
                self.run,
                self.out,
                call.id,
                call.name,
                call.kind,
                outcome.duration_ms,
                outcome.error,
            )
            return outcome

    async def _answer(
        self, call: ToolCall, key: tuple[str, str], tools: Mapping[str, ToolDefinition]
    ) -> ToolOutcome:
        """The call's outcome: from the run's cache (by its `identity`) when it may be, else
        by running it."""
        definition = tools.get(call.name)
        cacheable = definition is not None and definition.cacheable and call.kind == "backend"
        if cacheable and key in self.cache:
            return ToolOutcome(call, self.cache[key], cached=True)
        result = truncate_output(await self._run(call, definition, tools))
        if cacheable:
            self.cache[key] = result
        return ToolOutcome(call, result)

    async def _loop_decision(self, call: ToolCall) -> str:
        """What the user wants done with a repeated call: stop, continue or skip."""
        question = (
            f"The agent is calling '{call.name}' again with the same arguments. "
            "Continue (let it go on), skip this call, or stop the run?"
        )
        try:
            answer = await questions.ask(self.out, self.waits, question, LOOP_CHOICES)
        except ToolError:  # no answer in time
            return LOOP_SKIP
        if isinstance(answer, dict):
            answer = answer.get("answer", answer.get("choice"))
        if isinstance(answer, list) and len(answer) == 1:
            answer = answer[0]
        text = str(answer).strip().lower() if isinstance(answer, str) else ""
        return text if text in (LOOP_STOP, LOOP_CONTINUE) else LOOP_SKIP

    def refuse(self, call: ToolCall, reason: str) -> ToolOutcome:
        """Answer `call` with an error result without running it."""
        return self.report(ToolOutcome(call, f"Error: {reason}", error=True))

    def report(self, outcome: ToolOutcome) -> ToolOutcome:
        """Emit the outcome's result event."""
        call = outcome.call
        if call.kind == "action":
            self.out.emit(events.action_result(call.id, _plain(outcome.result)))
        else:
            result = _plain(outcome.result)
            rendered = self.rendered.pop(call.id, "")
            self.out.emit(
                events.tool_result(
                    call.id,
                    result,
                    error=outcome.error,
                    cached=outcome.cached,
                    rendered_arguments=rendered,
                )
            )
        if not outcome.error:
            self.memory.record(call.name, outcome.result)
        return outcome

    async def _run(
        self,
        call: ToolCall,
        definition: ToolDefinition | None,
        tools: Mapping[str, ToolDefinition],
    ) -> Any:
        if definition is None:
            offered = ", ".join(sorted(tools)) or "none"
            raise ToolError(f"unknown tool '{call.name}' (offered tools: {offered})")
        arguments = self._arguments(call)
        await permissions.check(self.out, self.waits, call, self.permission(call.name))
        if definition.kind == "action":
            self.out.emit(events.action_param(call.id, arguments))
            return ACTION_RESULT
        if definition.kind == "frontend":
            try:
                return await self.waits.wait(self.out, call.id, call.name, kind="frontend_tool")
            except WaitTimedOut as timed_out:
                raise ToolError(
                    f"the user did not answer '{call.name}' within {timed_out.timeout_s:g} s"
                ) from None
        return await self._backend(call, definition, arguments)

    def _arguments(self, call: ToolCall) -> dict[str, Any]:
        try:
            arguments = json.loads(call.arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ToolError(f"the arguments are not valid JSON ({exc.msg})") from None
        if not isinstance(arguments, dict):
            raise ToolError("the arguments must be a JSON object")
        if not has_templates(arguments):
            return arguments
        try:
            rendered: dict[str, Any] = render(arguments, self.memory)
        except TemplateError as exc:
            raise ToolError(f"argument template: {exc}") from None
        self.rendered[call.id] = _json(rendered)
        return rendered

    async def _backend(
        self, call: ToolCall, definition: ToolDefinition, arguments: dict[str, Any]
    ) -> Any:
        """Run the backend tool's implementation, as a step of the run: a resumed run is
        given the call's journaled result; a call it began and did not finish runs again
        when it may (an idempotent tool, a subagent: its own steps are journaled), and is
        answered `INTERRUPTED` otherwise."""
        delegate = self.delegates.get(definition.source)
        handler = delegate or self.registry.handler(call.name)
        if handler is None:
            raise ToolError(f"backend tool '{call.name}' has no implementation")

        async def run() -> tuple[bool, Any]:
            try:
                return True, await self._call(call, definition, arguments, handler)
            except ToolError as error:
                return False, str(error)

        may_rerun = definition.idempotent or delegate is not None
        done, value = await self.out.step(
            "tool",
            run,
            list,
            lambda data: (bool(data[0]), data[1]),
            key=f"tool {call.id}",
            interrupted=None if may_rerun else lambda: (False, INTERRUPTED),
        )
        if not done:
            raise ToolError(value)
        return value

    async def _call(
        self,
        call: ToolCall,
        definition: ToolDefinition,
        arguments: dict[str, Any],
        handler: ToolHandler,
    ) -> Any:
        timeout = definition.timeout_s or self.registry.default_timeout_s
        info = ToolCallInfo(
            self.out.run_id,
            self.out.chat_id,
            call.id,
            call.name,
            self.out.task_id,
            ask=functools.partial(questions.ask, self.out, self.waits),
            agent_key=self.agent_key,
            progress=Progress(self.out, call.id),
            files=FileNotices(self.out, call.id),
        )
        try:
            async with asyncio.timeout(timeout) as deadline:
                return await handler(arguments, info)
        except TimeoutError:
            if deadline.expired():
                raise ToolError(f"'{call.name}' timed out after {timeout:g} s") from None
            raise ToolError(f"'{call.name}' failed: operation timed out") from None
        except (ToolError, asyncio.CancelledError):
            raise
        except AgwError as error:
            raise ToolError(f"'{call.name}' failed: {error.message}") from None
        except Exception as error:
            log.warning("tool %s failed", call.name, exc_info=True)
            raise ToolError(f"'{call.name}' failed: {type(error).__name__}: {error}") from None


class _Stopped(Exception):
    """The user chose to stop the run at a repeated call."""


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _plain(value: Any) -> Any:
    """`value` as plain JSON data (anything else becomes its string form)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return json.loads(_json(value))
