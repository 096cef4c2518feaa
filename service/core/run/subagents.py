"""Subagents: other agents a stage offers as tools, each call a nested run.

A stage lists agent keys in `toolConfig.agents`; each is offered as a backend
tool named by the key that takes `{"task": "..."}`. A call runs that agent in
process, in its own mode, with a `RunContext` of its own: a fresh conversation
(the task is its user message; no chat history), its own block ids
(`{runId}_{toolId}_c_1`, …), its own policies — on the same run:

* its events stream in the run's log, in its one sequence, each carrying the
  calling tool's id as `parentToolId`; blocks it leaves open (it failed, or was
  stopped) are closed when it ends, before the call's `tool.result`;
* its answer — the text of its last answer block (one outside plan tasks when
  it has one) — is the call's result; a failure of the nested run (a budget,
  the provider) is the call's error result, and the caller goes on;
* the run bounds it: each of its model calls and tool calls counts in its own
  budget and in its caller's (so up to the run's root), it has at most its own
  `timeoutMs` (the call's time-out) within what is left of the run's, and
  cancelling the run cancels it;
* it is not part of the chat's conversation: the chat records its events, not
  its messages (service/core/chats/recorder.py).

Nesting is at most `max_depth` levels deep, and no agent calls itself through
its callers. `check` refuses a query whose agent's subagents (followed down)
name an agent that is not loaded (`TOOL_NOT_FOUND`), form a cycle or nest too
deep (`INVALID_REQUEST`); a call breaking the same rules later (agents change
while a run goes on) gets an error result.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from service.core.agents.definition import AgentDefinition
from service.core.agents.registry import AgentRegistry
from service.core.errors import InvalidRequest, ToolNotFound
from service.core.run import observation
from service.core.run.context import Mode, RunContext
from service.core.run.eventlog import EventLog
from service.core.tools.definitions import ToolDefinition, ToolError
from service.core.tools.sources import ToolCallInfo

log = logging.getLogger("agw.subagents")

MAX_DEPTH = 3
TASK_PARAMETERS = {
    "type": "object",
    "properties": {
        "task": {
            "type": "string",
            "description": "The task for the agent, with everything it needs to know.",
        }
    },
    "required": ["task"],
}
NO_ANSWER = "(the agent ended without an answer: {reason})"


class Subagents:
    """Offers agents as tools of other agents' stages and runs their calls as nested runs."""

    def __init__(
        self, agents: AgentRegistry, modes: Mapping[str, Mode], *, max_depth: int = MAX_DEPTH
    ) -> None:
        self.agents = agents
        self.modes = modes  # the mode each nested run runs in, by name
        self.max_depth = max_depth

    # -- before a run ------------------------------------------------------------------

    def check(self, agent: AgentDefinition) -> None:
        """Refuse `agent` if its subagents, followed down, break the rules (see the module)."""
        self._check(agent, ())

    def _check(self, agent: AgentDefinition, callers: tuple[str, ...]) -> None:
        chain = (*callers, agent.key)
        for stage in agent.stage_names:
            for key in agent.stage(stage).tools.agents:
                where = f"agent {chain[0]!r}"
                if key in chain:
                    path = " → ".join((*chain, key))
                    raise InvalidRequest(f"{where}: subagents call each other in a cycle ({path})")
                if len(chain) > self.max_depth:
                    path = " → ".join((*chain, key))
                    raise InvalidRequest(
                        f"{where}: subagents nest more than {self.max_depth} deep ({path})"
                    )
                child = self.agents.items.get(key)
                if child is None:
                    available = ", ".join(sorted(self.agents.items)) or "none"
                    raise ToolNotFound(
                        f"agent {agent.key!r}, stage {stage!r}: agents: '{key}' is not a loaded "
                        f"agent (available agents: {available})",
                        stage=stage,
                    )
                self._check(child, chain)

    # -- in a run ----------------------------------------------------------------------

    def offer(self, ctx: RunContext, keys: Sequence[str]) -> tuple[ToolDefinition, ...]:
        """The tools of the agents `keys` for a stage of `ctx`; their calls run through `call`."""
        offered = []
        for key in keys:
            agent = self.agents.items.get(key)
            if agent is None:
                log.warning(
                    "subagent %r of agent %r is not loaded: not offered", key, ctx.agent.key
                )
                continue
            about = agent.description or f"The agent {agent.name or key}."
            offered.append(
                ToolDefinition(
                    name=key,
                    kind="backend",
                    description=(
                        f"Delegate a task to the agent '{agent.name or key}', which works on it "
                        f"on its own and answers with its result. {about}"
                    ),
                    parameters=TASK_PARAMETERS,
                    timeout_s=agent.budget.timeout_s,
                    source=source_of(key),
                )
            )
            # The context owns its executor: the executor's handler refers back to it weakly.
            caller = weakref.ref(ctx)
            ctx.executor.delegates[source_of(key)] = functools.partial(self.call, caller, key)
        return tuple(offered)

    async def call(
        self,
        caller: weakref.ref[RunContext],
        key: str,
        arguments: dict[str, Any],
        call: ToolCallInfo,
    ) -> str:
        """Run agent `key` on `arguments["task"]` as a nested run of the `caller`; its answer."""
        ctx = caller()
        if ctx is None:  # the calling run is gone
            raise ToolError("the calling run has ended")
        task = arguments.get("task")
        if not isinstance(task, str) or not task.strip():
            raise ToolError("'task' must be a non-empty string: what the agent is to do")
        callers = (*ctx.lineage, ctx.agent.key)
        if key in callers:
            raise ToolError(f"agent '{key}' is already working on this run: no cycles")
        if len(callers) > self.max_depth:
            raise ToolError(f"subagents nest at most {self.max_depth} deep")
        agent = self.agents.get(key)
        nested = ctx.nested(agent, task, call.tool_id)
        log_ = ctx.run.log
        start = len(log_)
        attributes = {"agw.agent": key, "agw.mode": agent.mode, "gen_ai.tool.call.id": call.tool_id}
        with observation.span(f"subagent {key}", attributes=attributes):
            try:
                outcome = await self.modes[agent.mode](nested)
            finally:
                log_.close_nested(call.tool_id)
        return answer_of(log_, start, call.tool_id) or NO_ANSWER.format(
            reason=outcome.finish_reason
        )


def source_of(key: str) -> str:
    """The `source` of the tool of agent `key` (no tool source names itself so)."""
    return f"agent:{key}"


def answer_of(log: EventLog, start: int, tool_id: str) -> str:
    """The text of the last answer block of the nested run under `tool_id` (one outside
    plan tasks when there is one), from index `start` of the run's log."""
    texts: dict[str, list[str]] = {}
    last = {"": "", "task": ""}  # the last block outside tasks, and in a task
    for event in log[start:]:
        if event.parent_tool_id != tool_id:
            continue
        field = event.WhichOneof("payload")
        if field == "content_start":
            block = event.content_start.content_id
            texts[block] = []
            last["task" if event.task_id else ""] = block
        elif field == "content_delta":
            texts.get(event.content_delta.content_id, []).append(event.content_delta.delta)
    return "".join(texts.get(last[""] or last["task"], []))
