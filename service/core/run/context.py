"""What a mode runs with: the run, the scope it emits in, the agent, the query, the services.

A mode is a coroutine of a `RunContext` that returns an `Outcome` (or raises:
the runner turns either into the run's one terminal event). The context is
built by the runner (runner.py) for a run, and derived from it for one plan
task (`for_task`: its events carry the task's id) or for a subagent's nested
run (`nested`: its own agent, conversation, ids and budgets on the same run).

`RunQuery` is what the query brought (its command, the chat's memory, the
user's message as the model sees it); `RunServices` what the process offers
every run (the model router, the tools, the waits, subagents and skills).
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from service.core.agents.definition import AgentDefinition, ResolvedStage
from service.core.agents.schema import StageName
from service.core.agents.skills import SkillRegistry
from service.core.commands import QueryCommand
from service.core.model import ModelClient, ModelRequest, ModelRouter, Usage
from service.core.run.binding import BoundModel, bind, bind_stages
from service.core.run.eventlog import Emitter
from service.core.run.executor import ToolExecutor
from service.core.run.policies import NestedBudgets, RunPolicies
from service.core.run.prompt import PromptValues, render
from service.core.run.state import RunState
from service.core.run.transcript import Message, PastRun, flatten
from service.core.run.turn import Ids
from service.core.run.waits import Waits
from service.core.tools.definitions import ToolDefinition, client_tools
from service.core.tools.names import SKILL_TOOL
from service.core.tools.registry import StageTools, ToolRegistry

#: The stages that offer the tools a client declares: those whose tool calls run.
CLIENT_TOOL_STAGES: frozenset[StageName] = frozenset({"plain", "react", "execute"})


class RunStopped(Exception):
    """The user ended the run early; it completes with `finish_reason`."""

    def __init__(self, finish_reason: str) -> None:
        super().__init__(finish_reason)
        self.finish_reason = finish_reason


@dataclass(slots=True)
class Outcome:
    """How a mode ended normally."""

    finish_reason: str
    usage: Usage | None = None


class Subagents(Protocol):
    """Offers other agents as tools of a stage (service/core/run/subagents.py)."""

    def offer(self, ctx: RunContext, keys: Sequence[str]) -> tuple[ToolDefinition, ...]: ...


@dataclass(frozen=True, slots=True)
class RunServices:
    """What the process offers every run."""

    models: ModelRouter
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    waits: Waits = field(default_factory=Waits)  # where tools wait for the user's answers
    subagents: Subagents | None = None  # runs the agents a stage offers as tools
    skills: SkillRegistry | None = None  # the skills agents with `skills` are offered
    # A model's context length when neither the agent nor the known-models table says.
    context_length: int = 32_768


@dataclass(slots=True)
class RunQuery:
    """What the query brought: its command, the chat's memory, the user's message."""

    command: QueryCommand
    # The chat's earlier runs, oldest first: what the context window may summarise or trim.
    memory: list[PastRun] = field(default_factory=list)
    user_message: Message = field(default_factory=dict)  # as the model is given it
    # The messages a stage's conversation opens with before the user's: the memory's,
    # unless the run goes on from a conversation of its own (an escalation to a plan).
    history: list[Message] = field(default_factory=list)
    # The tools the client declared for the run (frontend tools it answers itself).
    client_tools: tuple[ToolDefinition, ...] = ()

    @classmethod
    def of(cls, command: QueryCommand, memory: list[PastRun], user_message: Message) -> RunQuery:
        tools = client_tools(command.tools) if command.tools else ()
        return cls(command, memory, user_message, flatten(memory), tools)

    @property
    def prompt_values(self) -> PromptValues:
        """What the system prompts' variables are filled in with."""
        return PromptValues.of(self.command)


@dataclass(slots=True, weakref_slot=True)
class RunContext:
    """Everything a mode needs to execute a run, seen from one scope of it."""

    run: RunState
    out: Emitter  # where this scope's events go (the run's, or one task's)
    agent: AgentDefinition
    query: RunQuery
    services: RunServices
    models: Mapping[StageName, BoundModel]  # each stage's model, bound once
    policies: RunPolicies  # budgets, tool policy, output, verify
    executor: ToolExecutor  # runs the tool calls
    ids: Ids
    lineage: tuple[str, ...] = ()  # the agents whose subagent this run is, outermost first

    @property
    def command(self) -> QueryCommand:
        return self.query.command

    def for_task(self, task_id: str) -> RunContext:
        """This context for plan task `task_id`: its events carry the task's id.

        Budgets, policies and the tool executor's memory stay the run's.
        """
        scoped = copy.copy(self)
        scoped.out = self.out.scope(task_id)
        scoped.executor = self.executor.scoped(scoped.out)
        return scoped

    def nested(self, agent: AgentDefinition, task: str, tool_id: str) -> RunContext:
        """The context of `agent`'s nested run on `task`, called by this one with `tool_id`:
        a fresh conversation, its own ids and policies, its budgets counting in these."""
        caller = self.command
        query = RunQuery(
            QueryCommand(
                agent.key,
                task,
                chat_id=self.run.chat_id,
                principal=caller.principal,
                params=caller.params,  # the request the caller serves: its prompts' values
                scene=caller.scene,
                started_at_ms=caller.started_at_ms,
            ),
            user_message={"role": "user", "content": task},
        )
        nested = new_context(
            self.run,
            self.out.nested(tool_id),
            agent,
            query,
            self.services,
            Ids(f"{self.ids.run_id}_{tool_id}", self._floors()),
            lineage=(*self.lineage, self.agent.key),
        )
        nested.policies.budgets = NestedBudgets(agent.budget, self.policies.budgets)
        return nested

    def _floors(self) -> dict[str, int]:
        steps = self.run.log.steps
        return steps.replay.floors if steps is not None and steps.replay is not None else {}

    def stage_tools(self, stage: ResolvedStage) -> StageTools:
        """The tools `stage` offers: its configured tools, its subagents, then the tools the
        client declared (in the stages that run tools)."""
        tools = self.services.tools.for_stage(stage, self.agent.tool_policy)
        if self.agent.tool_policy == "DISALLOW":
            return tools
        extra: tuple[ToolDefinition, ...] = ()
        subagents = self.services.subagents
        if subagents is not None and stage.tools.agents:
            extra += subagents.offer(self, stage.tools.agents)
        if stage.name in CLIENT_TOOL_STAGES:
            extra += self.query.client_tools
        return tools.extended(extra) if extra else tools

    def system_prompt(self, stage: ResolvedStage, tools: StageTools) -> str:
        """The system prompt of `stage` offering `tools`: hints, and the skills it may load."""
        text = tools.system_prompt(render(stage.system_prompt, self.query.prompt_values))
        skills = self.services.skills
        if skills is not None and SKILL_TOOL in tools.by_name:
            text += skills.prompt_section(self.agent)
        return text

    def model_call(
        self, stage: ResolvedStage, messages: list[dict[str, Any]], **options: Any
    ) -> tuple[ModelClient, ModelRequest]:
        """The client and request for a call of `stage` with `messages`."""
        bound = self.models.get(stage.name) or bind(self.services.models, stage)
        return bound.client, bound.request(stage, messages, self.run.run_id, **options)


Mode = Callable[[RunContext], Awaitable[Outcome]]


def new_context(
    run: RunState,
    out: Emitter,
    agent: AgentDefinition,
    query: RunQuery,
    services: RunServices,
    ids: Ids,
    *,
    models: Mapping[StageName, BoundModel] | None = None,
    lineage: tuple[str, ...] = (),
) -> RunContext:
    """A context for `agent` on `run`: its policies, its tool executor, its stages' models
    (`models` when the query bound them already)."""
    executor = ToolExecutor(
        run, out, services.tools, services.waits, agent.permission, agent_key=agent.key
    )
    executor.ask_on_loop = agent.loop_detect.ask
    return RunContext(
        run,
        out,
        agent,
        query,
        services,
        models if models is not None else bind_stages(services.models, agent),
        RunPolicies(agent),
        executor,
        ids,
        lineage,
    )
