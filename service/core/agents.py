"""Agent definitions: the v2 agent file, its rules, and the config each stage runs with.

An agent is one JSON file in `agents/`; the file name (without `.json`) is its key.
`load_agent_file` / `parse_agent_text` turn a file into an immutable `AgentDefinition`
or raise `AgentDefinitionError` naming each offending field and why.

Multi-line prompts. A value of a key whose name ends in `systemPrompt` (any case) may
be written as `\"\"\"...\"\"\"` (not standard JSON); it is converted to a JSON string before
parsing, by these rules:

* the text is taken verbatim: quotes, backslashes, tabs and indentation stay as written
  (no escape sequences are interpreted, no dedent); line endings become `\\n`;
* if the opening `\"\"\"` is followed only by blanks up to the end of its line, that line
  break is dropped; if the closing `\"\"\"` is preceded only by blanks since the last line
  break, that line break and the blanks are dropped;
* the text ends at the first `\"\"\"`; quotes that directly follow it belong to the text
  (`\"\"\"say "hi"\"\"\"` is `say "hi"`), so the text cannot contain `\"\"\"` itself.

A JSON syntax error is reported with the line and column of the original file.

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

import difflib
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import ComputedFieldInfo, FieldInfo
from pydantic_core import PydanticCustomError

from service.core.errors import InvalidRequest
from service.core.model import Effort, Reasoning

Mode = Literal["ONESHOT", "REACT", "PLAN_EXECUTE"]
Output = Literal["PLAIN", "REASONING_SUMMARY"]
ToolPolicy = Literal["DISALLOW", "ALLOW", "REQUIRE"]
Verify = Literal["NONE", "SECOND_PASS_FIX"]
Permission = Literal["ALLOW", "ASK", "DENY"]
StageName = Literal["plain", "react", "plan", "execute", "replan", "verify", "summary"]

PLAN_ADD_TASKS_TOOL = "_plan_add_tasks_"
PLAN_UPDATE_TASK_TOOL = "_plan_update_task_"
PLAN_DECIDE_TOOL = "_plan_decide_"
PLAN_VERIFY_TOOL = "_plan_verify_"
#: The tool of the call that summarises a chat's oldest turns (service/core/context.py).
CONTEXT_SUMMARY_TOOL = "_context_summary_"
PLANNING_TOOLS = (PLAN_ADD_TASKS_TOOL, PLAN_UPDATE_TASK_TOOL, PLAN_DECIDE_TOOL, PLAN_VERIFY_TOOL)
#: The tool that loads a skill's text, offered to the stages of agents with `skills`.
SKILL_TOOL = "skill"
SCHEMA_FILE_NAME = "agent.schema.json"

ToolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
SkillName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]
ProviderKey = Annotated[str, StringConstraints(min_length=1)]
AgentKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")]

# ---------------------------------------------------------------------------------------
# Errors


@dataclass(frozen=True, slots=True)
class AgentIssue:
    """One problem in an agent file: where (field path and/or position) and why."""

    path: str
    reason: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = self.path
        if self.line is not None:
            position = f"line {self.line}, column {self.column}"
            where = f"{where} (at {position})" if where else position
        return f"{where}: {self.reason}" if where else self.reason


class AgentDefinitionError(InvalidRequest):
    """An agent file is not a valid agent definition; `issues` says where and why."""

    def __init__(self, issues: Sequence[AgentIssue], source: str | None = None) -> None:
        text = "; ".join(str(issue) for issue in issues)
        super().__init__(f"{source}: {text}" if source else text, file=source or "")
        self.issues = tuple(issues)
        self.source = source


# ---------------------------------------------------------------------------------------
# The file's schema


def _title(name: str, info: FieldInfo | ComputedFieldInfo) -> str:
    return (info.alias if isinstance(info, FieldInfo) else None) or name


class _Strict(BaseModel):
    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, field_title_generator=_title
    )


class ReasoningConfig(_Strict):
    """Whether the model reasons before answering, and how hard."""

    enabled: bool = False
    effort: Effort = "MEDIUM"


class ModelConfig(_Strict):
    """Which model a stage calls, and with what sampling settings."""

    provider_key: str | None = Field(
        None, alias="providerKey", min_length=1, description="Default: the default provider."
    )
    model: str | None = Field(None, min_length=1, description="Default: the provider's model.")
    reasoning: ReasoningConfig | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, gt=0)
    context_length: int | None = Field(
        None,
        alias="contextLength",
        gt=0,
        description=(
            "The model's context window in tokens. Default: the service's table of known "
            "models (by name), else AGW_CONTEXT_LENGTH."
        ),
    )
    extra_body: dict[ProviderKey, dict[str, Any]] | None = Field(
        None,
        alias="extraBody",
        description=(
            'Fields merged into the request body, per provider key ("*": every provider; '
            "a provider's own entry wins key by key); they win over the provider's "
            'extra_body setting. e.g. {"*": {"seed": 7}, "ollama": {"options": {"num_ctx": 8192}}}'
        ),
    )


class ToolConfig(_Strict):
    """The ordinary tools a stage may use, by kind."""

    backends: list[ToolName] = Field(default_factory=list)
    frontends: list[ToolName] = Field(default_factory=list)
    actions: list[ToolName] = Field(default_factory=list)
    mcp: list[ToolName] = Field(
        default_factory=list,
        description="Configured MCP servers (AGW_MCP_SERVERS) whose every tool is offered.",
    )
    agents: list[ToolName] = Field(
        default_factory=list,
        description=(
            "Keys of other agents offered as tools (subagents): the model calls one with "
            "{task}; its nested run streams inside this run and its answer is the result."
        ),
    )

    @model_validator(mode="after")
    def _unique_names(self) -> ToolConfig:
        issues: list[tuple[str, str]] = []
        servers: dict[str, str] = {}
        for index, name in enumerate(self.mcp):
            if name in servers:
                issues.append((f"mcp[{index}]", f"duplicate server '{name}' (see {servers[name]})"))
            servers.setdefault(name, f"mcp[{index}]")
        seen: dict[str, str] = {}
        for kind in ("backends", "frontends", "actions", "agents"):
            for index, name in enumerate(getattr(self, kind)):
                where = f"{kind}[{index}]"
                if name in PLANNING_TOOLS:
                    issues.append((where, f"'{name}' is a planning tool the runner adds itself"))
                elif name in seen:
                    issues.append((where, f"duplicate tool name '{name}' (see {seen[name]})"))
                else:
                    seen[name] = where
        _raise_issues(issues)
        return self


class _PromptStage(_Strict):
    system_prompt: str = Field(alias="systemPrompt", json_schema_extra={"minLength": 1})
    model_config_: ModelConfig | None = Field(None, alias="modelConfig")

    @field_validator("system_prompt")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value


class _Stage(_PromptStage):
    tool_config: ToolConfig | None = Field(
        None, alias="toolConfig", description="Overrides the outer toolConfig; null clears it."
    )


class PlainStage(_Stage):
    """ONESHOT: one answer, tools allowed within that turn."""


class ReactStage(_Stage):
    """REACT: think, call at most one tool, observe; at most `maxSteps` rounds."""

    max_steps: int = Field(6, alias="maxSteps", gt=0)
    escalate: bool = Field(
        False,
        description=(
            "Offer the plan_create tool: calling it switches the run to PLAN_EXECUTE "
            "(the planExecute stages, required then), planning from the conversation so far."
        ),
    )


class PlanStage(_Stage):
    """PLAN_EXECUTE planning: one call, or a reasoning draft first with `deepThinking`."""

    deep_thinking: bool = Field(False, alias="deepThinking")
    approval: bool = Field(
        False,
        description="Wait for the user's approval of the plan (plan.approval, Submit) first.",
    )
    max_tasks: int = Field(
        10,
        alias="maxTasks",
        gt=0,
        le=100,
        description="The most tasks a plan may have; a larger plan is refused to the planner.",
    )


class ExecuteStage(_Stage):
    """PLAN_EXECUTE execution of each planned task."""

    parallel: int = Field(
        1,
        gt=0,
        le=16,
        description=(
            "How many tasks may run at once. 1: one after another, in plan order; more: the "
            "tasks run as a graph of their dependsOn, each with its own conversation."
        ),
    )
    max_rounds: int = Field(
        10,
        alias="maxRounds",
        gt=0,
        description="Tool rounds of one task at most; then the task is asked for its report.",
    )


class ReplanStage(_PromptStage):
    """PLAN_EXECUTE replanner: after each task (wave), continue, revise or finish the plan."""

    only_after_failure: bool = Field(
        False,
        alias="onlyAfterFailure",
        description="Ask the replanner only after a task (wave) in which a task failed.",
    )


class VerifyStage(_PromptStage):
    """PLAN_EXECUTE verifier: judges the results; `needsMorePlanning` plans again."""

    max_rounds: int = Field(
        3,
        alias="maxRounds",
        gt=0,
        le=10,
        description="Planning rounds at most (the first included) before the summary.",
    )


class SummaryStage(_Stage):
    """PLAN_EXECUTE optional final summary."""


class PlanExecuteConfig(_Strict):
    """The stages of PLAN_EXECUTE; `plan` and `execute` are required, the others optional."""

    plan: PlanStage | None = None
    execute: ExecuteStage | None = None
    replan: ReplanStage | None = None
    verify: VerifyStage | None = None
    summary: SummaryStage | None = None


class ContextConfig(_Strict):
    """How the prompt is kept within the model's context window (`modelConfig.contextLength`)."""

    compress_at: float = Field(
        0.8,
        alias="compressAt",
        gt=0,
        le=1,
        description=(
            "Before a model call whose estimated prompt exceeds this share of the context "
            "length, the oldest turns of the chat's memory are summarised by the model."
        ),
    )
    keep_turns: int = Field(
        1,
        alias="keepTurns",
        ge=0,
        description="The newest turns of the chat's memory kept word for word when summarising.",
    )
    prune_at: float = Field(
        0.5,
        alias="pruneAt",
        gt=0,
        le=1,
        description=(
            "When this run's own messages exceed this share of the context length, its older "
            "tool outputs are replaced by a short note."
        ),
    )
    keep_tool_outputs: int = Field(
        2,
        alias="keepToolOutputs",
        ge=0,
        description="The newest tool outputs of the run never pruned.",
    )


class LoopDetectConfig(_Strict):
    """What happens when the same tool call repeats (see `loop.detect`)."""

    ask: bool = Field(
        False,
        description=(
            "Ask the user (question.ask with stop / continue / skip) instead of refusing "
            "the repeated call at once."
        ),
    )


class Budget(_Strict):
    """Limits of one run; exceeding one ends the run."""

    max_model_calls: int = Field(20, alias="maxModelCalls", gt=0)
    max_tool_calls: int = Field(10, alias="maxToolCalls", gt=0)
    max_steps: int = Field(6, alias="maxSteps", gt=0)
    timeout_ms: int = Field(120_000, alias="timeoutMs", gt=0)

    @property
    def timeout_s(self) -> float:
        return self.timeout_ms / 1000


# ---------------------------------------------------------------------------------------
# Resolved stage config


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


_MODE_STAGES: dict[str, tuple[StageName, ...]] = {
    "ONESHOT": ("plain",),
    "REACT": ("react",),
    "PLAN_EXECUTE": ("plan", "execute", "replan", "verify", "summary"),
}
_OPTIONAL_STAGES: frozenset[StageName] = frozenset({"replan", "verify", "summary"})
_STAGE_PATHS: dict[StageName, str] = {
    "plain": "plain",
    "react": "react",
    "plan": "planExecute.plan",
    "execute": "planExecute.execute",
    "replan": "planExecute.replan",
    "verify": "planExecute.verify",
    "summary": "planExecute.summary",
}
_PLANNING_TOOLS_OF: dict[StageName, tuple[str, ...]] = {
    "plan": (PLAN_ADD_TASKS_TOOL,),
    "execute": (PLAN_UPDATE_TASK_TOOL,),
    "replan": (PLAN_DECIDE_TOOL,),
    "verify": (PLAN_VERIFY_TOOL,),
}


def _key_optional(schema: dict[str, Any]) -> None:
    """In a file `key` may be omitted: it defaults to the file name."""
    schema["required"] = [name for name in schema["required"] if name != "key"]


class AgentDefinition(_Strict):
    """An agw agent (v2). The file name is the agent key."""

    model_config = ConfigDict(json_schema_extra=_key_optional)

    json_schema_ref: str | None = Field(None, alias="$schema")
    key: AgentKey = Field(description="Optional; must equal the file name without .json.")
    name: str = Field("", description="Display name; defaults to the key.")
    icon: str | None = Field(None, description='e.g. "emoji:🤖"')
    description: str = ""
    model_config_: ModelConfig | None = Field(None, alias="modelConfig")
    tool_config: ToolConfig | None = Field(None, alias="toolConfig")
    mode: Mode
    modes: list[Mode] | None = Field(
        None,
        description=(
            "The modes a query may choose (QueryRequest.mode), each with its stages; "
            "must include `mode`, the default. Default: only `mode`."
        ),
    )
    output: Output = "PLAIN"
    tool_policy: ToolPolicy = Field("ALLOW", alias="toolPolicy")
    verify: Verify = "NONE"
    tool_permissions: dict[str, Permission] = Field(
        default_factory=dict,
        alias="toolPermissions",
        description=(
            'Per tool name (or "*" for every other tool): ALLOW runs it, ASK waits for the '
            "user's permission through Submit, DENY refuses it. Default ALLOW."
        ),
    )
    budget: Budget = Field(default_factory=Budget)
    context: ContextConfig = Field(default_factory=ContextConfig)
    loop_detect: LoopDetectConfig = Field(default_factory=LoopDetectConfig, alias="loopDetect")
    skills: bool | list[SkillName] = Field(
        False,
        description=(
            "Offer skills (the folders of the skills directory): true for all, or their "
            "names. Their names and descriptions go into the system prompt, and the "
            "`skill` tool loads one's full text."
        ),
    )
    plain: PlainStage | None = None
    react: ReactStage | None = None
    plan_execute: PlanExecuteConfig | None = Field(None, alias="planExecute")

    @model_validator(mode="before")
    @classmethod
    def _defaults_from_file(cls, data: Any, info: ValidationInfo) -> Any:
        """Take `key` from the file name when absent, and `name` from the key."""
        if isinstance(data, dict):
            file_key = (info.context or {}).get("key")
            if "key" not in data and file_key is not None:
                data = {**data, "key": file_key}
            if "name" not in data and isinstance(data.get("key"), str):
                data = {**data, "name": data["key"]}
        return data

    @model_validator(mode="after")
    def _check_rules(self, info: ValidationInfo) -> AgentDefinition:
        issues: list[tuple[str, str]] = []
        file_key = (info.context or {}).get("key")
        if file_key is not None and self.key != file_key:
            issues.append(
                ("key", f"'{self.key}' must equal the file name '{file_key}' (or be omitted)")
            )
        modes = self.modes if self.modes is not None else [self.mode]
        if self.mode not in modes:
            issues.append(("modes", f"must include the agent's mode {self.mode}"))
        if len(set(modes)) != len(modes):
            issues.append(("modes", "lists a mode twice"))
        needed: dict[StageName, str] = {}
        for mode in dict.fromkeys([self.mode, *modes]):
            for stage in _MODE_STAGES[mode]:
                if stage not in _OPTIONAL_STAGES:
                    needed.setdefault(stage, f"mode {mode}")
        if self.react is not None and self.react.escalate:
            for stage in ("plan", "execute"):
                needed.setdefault(stage, "react.escalate")
        for stage, by in needed.items():
            if self._stage_config(stage) is None:
                issues.append((_STAGE_PATHS[stage], f"is required by {by} (with a systemPrompt)"))
        _raise_issues(issues)
        return self

    # -- policies and mode settings -----------------------------------------------------

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
        return self.model_copy(update={"mode": mode})

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
        names = _MODE_STAGES[self.mode] + (_MODE_STAGES["PLAN_EXECUTE"] if self.escalates else ())
        return tuple(s for s in names if self._stage_config(s) is not None)

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

    # -- resolution ---------------------------------------------------------------------

    def has_stage(self, name: StageName) -> bool:
        return self._stage_config(name) is not None

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
        config = self._stage_config(name)
        if config is None:
            raise LookupError(f"agent {self.key!r} has no {_STAGE_PATHS[name]!r} stage")
        return ResolvedStage(
            name=name,
            system_prompt=config.system_prompt,
            model=_merge_models(self.model_config_, config.model_config_),
            tools=self._stage_tools(config),
            planning_tools=_PLANNING_TOOLS_OF.get(name, ()),
        )

    def _stage_config(self, name: StageName) -> _PromptStage | None:
        if name == "plain":
            return self.plain
        if name == "react":
            return self.react
        if self.plan_execute is None:
            return None
        stages: dict[str, _PromptStage | None] = {
            "plan": self.plan_execute.plan,
            "execute": self.plan_execute.execute,
            "replan": self.plan_execute.replan,
            "verify": self.plan_execute.verify,
            "summary": self.plan_execute.summary,
        }
        return stages[name]

    def _stage_tools(self, config: _PromptStage) -> ResolvedTools:
        """The stage's tools; with `skills`, the `skill` tool too (unless the stage clears them)."""
        if not isinstance(config, _Stage):  # a stage with only its fixed planning tool
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


def _raise_issues(issues: list[tuple[str, str]]) -> None:
    """Report rule violations from a validator; `_issues_from` turns them into AgentIssues."""
    if issues:
        text = "; ".join(f"{path}: {reason}" for path, reason in issues)
        raise PydanticCustomError("agent_rule", "{text}", {"text": text, "issues": issues})


# ---------------------------------------------------------------------------------------
# Reading a file


def load_agent_file(path: Path) -> AgentDefinition:
    """Read and validate one agent file; its key is the file name without `.json`."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AgentDefinitionError([AgentIssue("", f"not UTF-8 text ({exc})")], path.name) from exc
    return parse_agent_text(text, key=path.stem, source=path.name)


def parse_agent_text(text: str, *, key: str | None, source: str | None = None) -> AgentDefinition:
    """Validate an agent file's text; `key` is the file's key (None: the text must have one)."""
    try:
        data = parse_agent_json(text)
        if not isinstance(data, dict):
            raise AgentDefinitionError([AgentIssue("", "the file must hold one JSON object")])
        context = {"key": key} if key is not None else {}
        return AgentDefinition.model_validate(data, context=context)
    except AgentDefinitionError as exc:
        raise AgentDefinitionError(exc.issues, source) from None
    except ValidationError as exc:
        raise AgentDefinitionError(list(_issues_from(exc)), source) from None


def parse_agent_json(text: str) -> Any:
    """Parse the file's JSON after converting `\"\"\"` prompts; errors name original positions."""
    converted, replacements = convert_multiline_prompts(text)
    try:
        return json.loads(converted, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        line, column = _line_column(text, _original_offset(exc.pos, replacements))
        raise AgentDefinitionError(
            [AgentIssue("", f"invalid JSON: {exc.msg}", line, column)]
        ) from None
    except _DuplicateKey as exc:
        raise AgentDefinitionError([AgentIssue(exc.key, "duplicate key in one object")]) from None


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, value in pairs:
        if name in result:
            raise _DuplicateKey(name)
        result[name] = value
    return result


# (original start, original end, converted start, converted end) of each replaced text
Replacement = tuple[int, int, int, int]


def convert_multiline_prompts(text: str) -> tuple[str, list[Replacement]]:
    """Replace each `\"\"\"...\"\"\"` value by a JSON string; see the module docstring."""
    parts: list[str] = []
    replacements: list[Replacement] = []
    copied = converted_length = 0
    for start, end, key in _triple_quoted(text):
        if key is None or not key.lower().endswith("systemprompt"):
            line, column = _line_column(text, start)
            where = f" for key '{key}'" if key is not None else " outside a key's value"
            reason = f'""" text is not allowed{where}: only for keys ending in systemPrompt'
            raise AgentDefinitionError([AgentIssue(key or "", reason, line, column)])
        literal = json.dumps(_trim_multiline(text[start + 3 : end - 3]), ensure_ascii=False)
        parts.append(text[copied:start])
        converted_length += start - copied
        replacements.append((start, end, converted_length, converted_length + len(literal)))
        parts.append(literal)
        converted_length += len(literal)
        copied = end
    parts.append(text[copied:])
    return "".join(parts), replacements


def _triple_quoted(text: str) -> Iterator[tuple[int, int, str | None]]:
    """Yield (start, end, key) of each `\"\"\"` text; key is None unless it is a key's value."""
    last_string: str | None = None
    key: str | None = None
    previous = ""  # the last significant token: "string", ":" or another character
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if text.startswith('"""', i):
            close = text.find('"""', i + 3)
            if close < 0:
                line, column = _line_column(text, i)
                where = (key or "") if previous == ":" else ""
                issue = AgentIssue(where, 'unterminated """ text', line, column)
                raise AgentDefinitionError([issue])
            end = close + 3
            while end < n and text[end] == '"':
                end += 1
            yield i, end, key if previous == ":" else None
            i, previous = end, "value"
            continue
        if char == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            last_string, previous, i = _decode_string(text[i : j + 1]), "string", j + 1
            continue
        if char == ":":
            key = last_string if previous == "string" else None
            previous = ":"
        elif not char.isspace():
            previous = char
        i += 1


def _decode_string(literal: str) -> str:
    try:
        value = json.loads(literal)
    except json.JSONDecodeError:
        return literal.strip('"')
    return value if isinstance(value, str) else literal


def _trim_multiline(body: str) -> str:
    body = body.replace("\r\n", "\n").replace("\r", "\n")
    first_break = body.find("\n")
    if first_break >= 0 and not body[:first_break].strip():
        body = body[first_break + 1 :]
    last_break = body.rfind("\n")
    if last_break >= 0 and not body[last_break + 1 :].strip():
        body = body[:last_break]
    return body


def _original_offset(position: int, replacements: list[Replacement]) -> int:
    shift = 0
    for original_start, original_end, start, end in replacements:
        if position < start:
            break
        if position < end:
            return original_start
        shift = end - original_end
    return position - shift


def _line_column(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


# ---------------------------------------------------------------------------------------
# Validation errors → issues


def _issues_from(error: ValidationError) -> Iterator[AgentIssue]:
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        kind = item["type"]
        if kind == "agent_rule":
            for path, reason in item["ctx"]["issues"]:
                yield AgentIssue(_join_path((*loc, *path.split("."))), reason)
            continue
        if kind == "missing":
            reason = "is required"
        elif kind == "extra_forbidden":
            reason = "unknown key" + _suggestion(loc)
        else:
            reason = item["msg"].removeprefix("Value error, ")
            value = item.get("input")
            if isinstance(value, str | int | float | bool) and kind != "value_error":
                reason += f" (got {json.dumps(value, ensure_ascii=False)})"
        yield AgentIssue(_join_path(loc), reason)


def _join_path(loc: Sequence[str | int]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part:
            path += f".{part}" if path else part
    return path


def _suggestion(loc: Sequence[str | int]) -> str:
    """' (did you mean ...?)' for a misspelled key, from the keys its object allows."""
    model: type[BaseModel] | None = AgentDefinition
    for part in loc[:-1]:
        if model is None or isinstance(part, int):
            continue
        info = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        model = _model_of(info.annotation) if info is not None else None
    if model is None:
        return ""
    known = [f.alias or n for n, f in model.model_fields.items()]
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


# ---------------------------------------------------------------------------------------
# JSON Schema


def agent_json_schema() -> dict[str, Any]:
    """The JSON Schema of agent files (`agents/agent.schema.json`)."""
    schema = AgentDefinition.model_json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def agent_schema_text() -> str:
    """The exact content of `agents/agent.schema.json`."""
    return json.dumps(agent_json_schema(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":  # python -m service.core.agents agents/agent.schema.json
    Path(sys.argv[1]).write_text(agent_schema_text(), encoding="utf-8")
