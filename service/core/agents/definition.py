"""The agent the service runs: its policies, its modes, and the config each stage runs with.

Resolution. `AgentDefinition.stage(name)` merges the outer `modelConfig` with the stage's,
field by field (the stage wins; `reasoning` is merged field by field too), and takes the
stage's `toolConfig` when the stage has that key (an explicit `null` clears the ordinary
tools), else the outer one. PLAN_EXECUTE's planning tools are not part of `toolConfig`:
the runner adds them (`PLAN_ADD_TASKS_TOOL`, `PLAN_UPDATE_TASK_TOOL`, and `PLAN_DECIDE_TOOL`,
`PLAN_VERIFY_TOOL` for the optional replan and verify stages, which have no ordinary tools).

Modes. `mode` is the mode a query runs in unless it chooses another of `modes` (the
request's `mode`); `AgentDefinition.in_mode` gives the agent as it runs in that mode.
A REACT agent with `react.escalate` may switch to PLAN_EXECUTE mid-run, so it needs
the `planExecute` stages too. `toolConfig.agents` names other agents offered as tools
(subagents), `skills` the skills offered (the `skill` tool, added to each stage that
does not clear its tools).

`modelConfig.extraBody` holds request-body fields per provider key ("*": every provider);
a stage's `extraBody` replaces the outer one whole; `ResolvedModel.body_for(provider)`
gives the fields of one provider.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import orjson

from service.core.agents.schema import (
    MODE_STAGES,
    STAGE_PATHS,
    AgentFile,
    Mode,
    ModelConfig,
    Permission,
    PromptStage,
    StageName,
    ToolConfig,
    ToolStage,
)
from service.core.errors import InvalidRequest
from service.core.model import Reasoning
from service.core.tools.names import (
    PLAN_ADD_TASKS_TOOL,
    PLAN_DECIDE_TOOL,
    PLAN_UPDATE_TASK_TOOL,
    PLAN_VERIFY_TOOL,
    SKILL_TOOL,
)


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """The model settings a stage runs with; None means the provider's default."""

    provider_key: str | None = None
    model: str | None = None
    reasoning: Reasoning = field(default_factory=Reasoning)
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    context_length: int | None = None
    extra_body: dict[str, dict[str, Any]] = field(default_factory=dict)

    def body_for(self, provider: str) -> dict[str, Any]:
        """The extra request-body fields for `provider`: the "*" entry, then its own."""
        return {**self.extra_body.get("*", {}), **self.extra_body.get(provider, {})}


@dataclass(frozen=True, slots=True)
class ResolvedTools:
    """The ordinary tools a stage may use (planning tools excluded), subagents included."""

    backends: tuple[str, ...] = ()
    frontends: tuple[str, ...] = ()
    actions: tuple[str, ...] = ()
    mcp: tuple[str, ...] = ()  # MCP servers whose every tool is offered
    agents: tuple[str, ...] = ()  # keys of the agents offered as tools

    @property
    def names(self) -> tuple[str, ...]:
        return self.backends + self.frontends + self.actions + self.agents


@dataclass(frozen=True, slots=True)
class ResolvedStage:
    """Everything one stage runs with.

    `planning_tools` are the fixed PLAN_EXECUTE tools of the stage (plan:
    `_plan_add_tasks_`, execute: `_plan_update_task_`, replan: `_plan_decide_`,
    verify: `_plan_verify_`), added by the runner.
    """

    name: StageName
    system_prompt: str
    model: ResolvedModel
    tools: ResolvedTools
    planning_tools: tuple[str, ...] = ()


#: What a definition works out once and keeps (`cached_property`): made anew in a copy.
_RESOLVED_ONCE = ("_resolved_stages", "json_bytes")

_PLANNING_TOOLS_OF: dict[StageName, tuple[str, ...]] = {
    "plan": (PLAN_ADD_TASKS_TOOL,),
    "execute": (PLAN_UPDATE_TASK_TOOL,),
    "replan": (PLAN_DECIDE_TOOL,),
    "verify": (PLAN_VERIFY_TOOL,),
}


class AgentDefinition(AgentFile):
    """An agw agent (v2). The file name is the agent key."""

    def permission(self, tool_name: str) -> Permission:
        """How a call of `tool_name` is permitted (the tool's entry, else "*", else ALLOW)."""
        return self.tool_permissions.get(tool_name) or self.tool_permissions.get("*") or "ALLOW"

    @property
    def allowed_modes(self) -> tuple[Mode, ...]:
        """The modes a query may run this agent in, its `mode` first."""
        return tuple(dict.fromkeys([self.mode, *(self.modes or ())]))

    def in_mode(self, mode: Mode) -> AgentDefinition:
        """This agent running in `mode` (one of `allowed_modes`) instead of its default."""
        if mode == self.mode:
            return self
        if mode not in self.allowed_modes:
            allowed = ", ".join(self.allowed_modes)
            raise InvalidRequest(
                f"agent {self.key!r} does not run in mode {mode} (it allows {allowed}; "
                'a query may choose among the modes listed in its "modes")',
                agent_key=self.key,
            )
        return self.copy_with({"mode": mode})

    def copy_with(self, update: dict[str, Any]) -> AgentDefinition:
        """This definition with `update`, what it resolved once (its stages, its JSON) made
        anew: `model_copy` would copy what `cached_property` keeps."""
        changed = self.model_copy(update=update)
        for name in _RESOLVED_ONCE:
            changed.__dict__.pop(name, None)
        return changed

    @property
    def escalates(self) -> bool:
        """Whether a REACT run may switch to PLAN_EXECUTE (`react.escalate`)."""
        return self.mode == "REACT" and self.react is not None and self.react.escalate

    def offers_skill(self, name: str) -> bool:
        """Whether the agent's `skills` include skill `name`."""
        return self.skills is True or (isinstance(self.skills, list) and name in self.skills)

    @property
    def react_max_steps(self) -> int:
        """REACT's round limit (`react.maxSteps`, default 6)."""
        return self.react.max_steps if self.react is not None else 6

    @property
    def plan_approval(self) -> bool:
        """Whether PLAN_EXECUTE waits for the user's approval of the plan."""
        plan = self.plan_execute.plan if self.plan_execute is not None else None
        return plan.approval if plan is not None else False

    @property
    def deep_thinking(self) -> bool:
        """Whether PLAN_EXECUTE plans in two calls (`planExecute.plan.deepThinking`)."""
        plan = self.plan_execute.plan if self.plan_execute is not None else None
        return plan.deep_thinking if plan is not None else False

    @property
    def plan_max_tasks(self) -> int:
        """The most tasks a PLAN_EXECUTE plan may have (`planExecute.plan.maxTasks`)."""
        plan = self.plan_execute.plan if self.plan_execute is not None else None
        return plan.max_tasks if plan is not None else 10

    @property
    def plan_parallel(self) -> int:
        """How many plan tasks may run at once (`planExecute.execute.parallel`, default 1)."""
        execute = self.plan_execute.execute if self.plan_execute is not None else None
        return execute.parallel if execute is not None else 1

    @property
    def task_max_rounds(self) -> int:
        """Tool rounds of one plan task before it must report (`execute.maxRounds`)."""
        execute = self.plan_execute.execute if self.plan_execute is not None else None
        return execute.max_rounds if execute is not None else 10

    @property
    def replan_only_after_failure(self) -> bool:
        """Whether the replanner is asked only after a failed or skipped task."""
        replan = self.plan_execute.replan if self.plan_execute is not None else None
        return replan.only_after_failure if replan is not None else False

    @property
    def verify_max_rounds(self) -> int:
        """Planning rounds at most when a verifier is configured (`verify.maxRounds`)."""
        verify = self.plan_execute.verify if self.plan_execute is not None else None
        return verify.max_rounds if verify is not None else 1

    @property
    def stage_names(self) -> tuple[StageName, ...]:
        """The stages this agent's mode runs, in order (optional ones only when configured).

        A REACT agent that escalates may go on with the PLAN_EXECUTE stages.
        """
        names = MODE_STAGES[self.mode] + (MODE_STAGES["PLAN_EXECUTE"] if self.escalates else ())
        return tuple(s for s in names if self.stage_config(s) is not None)

    def tool_names(self) -> list[str]:
        """Every ordinary tool the mode's stages may use, each once, in file order."""
        names: dict[str, None] = {}
        for stage in self.stage_names:
            names.update(dict.fromkeys(self.stage(stage).tools.names))
        return list(names)

    def to_json_dict(self) -> dict[str, Any]:
        """The definition as written (multi-line prompts converted), without `$schema`."""
        return self.model_dump(
            mode="json", by_alias=True, exclude_unset=True, exclude={"json_schema_ref"}
        )

    @cached_property
    def json_bytes(self) -> bytes:
        """`to_json_dict` as compact UTF-8 JSON, made once (each run journals it)."""
        return orjson.dumps(self.to_json_dict())

    # -- resolution ---------------------------------------------------------------------

    def has_stage(self, name: StageName) -> bool:
        return self.stage_config(name) is not None

    @cached_property
    def _resolved_stages(self) -> dict[StageName, ResolvedStage]:
        """The stages resolved so far (the definition is frozen: each is resolved once)."""
        return {}

    def stage(self, name: StageName) -> ResolvedStage:
        """The config stage `name` runs with; LookupError when the file has no such stage.

        Resolved once per stage (a run asks for its stages several times on its way to
        the model request); `ResolvedStage` is frozen.
        """
        resolved = self._resolved_stages.get(name)
        if resolved is None:
            resolved = self._resolved_stages[name] = self._resolve_stage(name)
        return resolved

    def _resolve_stage(self, name: StageName) -> ResolvedStage:
        config = self.stage_config(name)
        if config is None:
            raise LookupError(f"agent {self.key!r} has no {STAGE_PATHS[name]!r} stage")
        return ResolvedStage(
            name=name,
            system_prompt=config.system_prompt,
            model=_merge_models(self.model_config_, config.model_config_),
            tools=self._stage_tools(config),
            planning_tools=_PLANNING_TOOLS_OF.get(name, ()),
        )

    def _stage_tools(self, config: PromptStage) -> ResolvedTools:
        """The stage's tools; with `skills`, the `skill` tool too (unless the stage clears them)."""
        if not isinstance(config, ToolStage):  # a stage with only its fixed planning tool
            return ResolvedTools()
        own = "tool_config" in config.model_fields_set
        tools = config.tool_config if own else self.tool_config
        if tools is None:
            if own:  # an explicit null: the stage has no ordinary tools
                return ResolvedTools()
            tools = ToolConfig()
        backends = tuple(tools.backends)
        if self.skills and SKILL_TOOL not in backends:
            backends += (SKILL_TOOL,)
        return ResolvedTools(
            backends,
            tuple(tools.frontends),
            tuple(tools.actions),
            mcp=tuple(tools.mcp),
            agents=tuple(tools.agents),
        )


def _merge_models(*layers: ModelConfig | None) -> ResolvedModel:
    """Merge model configs field by field; a field set in a later layer wins."""
    values: dict[str, Any] = {}
    reasoning: dict[str, Any] = {}
    for layer in layers:
        if layer is None:
            continue
        for name in layer.model_fields_set:
            if name == "extra_body":
                values[name] = layer.extra_body or {}
            elif name != "reasoning":
                values[name] = getattr(layer, name)
            elif layer.reasoning is None:
                reasoning = {}
            else:
                reasoning.update(
                    {f: getattr(layer.reasoning, f) for f in layer.reasoning.model_fields_set}
                )
    return ResolvedModel(reasoning=Reasoning(**reasoning), **values)
