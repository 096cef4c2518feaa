"""The agent file's schema: its keys, their types and limits, and the rules across them.

An agent is one JSON file in `agents/`; the file name (without `.json`) is its key.
`AgentFile` is the file's root object as validated (pydantic, strict, frozen); the
definition the service runs (`service/core/agents/definition.py`) adds the policies
and the stage resolution to it, and the loader (`loader.py`) reads the text and
reports what is wrong. The JSON Schema of these models is `agents/agent.schema.json`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import ComputedFieldInfo, FieldInfo
from pydantic_core import PydanticCustomError

from service.core.agents.variables import prompt_issues
from service.core.model import Effort
from service.core.tools.names import PLANNING_TOOLS

Mode = Literal["ONESHOT", "REACT", "PLAN_EXECUTE"]
Output = Literal["PLAIN", "REASONING_SUMMARY"]
ToolPolicy = Literal["DISALLOW", "ALLOW", "REQUIRE"]
Verify = Literal["NONE", "SECOND_PASS_FIX"]
Permission = Literal["ALLOW", "ASK", "DENY"]
#: What a query may change for its run (`QueryRequest.overrides`) when an agent allows it.
Override = Literal[
    "model",
    "providerKey",
    "temperature",
    "top_p",
    "max_tokens",
    "reasoning.enabled",
    "reasoning.effort",
    "budget.maxModelCalls",
    "budget.maxToolCalls",
    "budget.maxSteps",
    "budget.timeoutMs",
]
StageName = Literal["plain", "react", "plan", "execute", "replan", "verify", "summary"]

ToolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
SkillName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]
ProviderKey = Annotated[str, StringConstraints(min_length=1)]
AgentKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")]


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


class PromptStage(_Strict):
    system_prompt: str = Field(alias="systemPrompt", json_schema_extra={"minLength": 1})
    model_config_: ModelConfig | None = Field(None, alias="modelConfig")

    @field_validator("system_prompt")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value


class ToolStage(PromptStage):
    tool_config: ToolConfig | None = Field(
        None, alias="toolConfig", description="Overrides the outer toolConfig; null clears it."
    )


class PlainStage(ToolStage):
    """ONESHOT: one answer, tools allowed within that turn."""


class ReactStage(ToolStage):
    """REACT: think, call at most one tool, observe; at most `maxSteps` rounds."""

    max_steps: int = Field(6, alias="maxSteps", gt=0)
    escalate: bool = Field(
        False,
        description=(
            "Offer the plan_create tool: calling it switches the run to PLAN_EXECUTE "
            "(the planExecute stages, required then), planning from the conversation so far."
        ),
    )


class PlanStage(ToolStage):
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


class ExecuteStage(ToolStage):
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


class ReplanStage(PromptStage):
    """PLAN_EXECUTE replanner: after each task (wave), continue, revise or finish the plan."""

    only_after_failure: bool = Field(
        False,
        alias="onlyAfterFailure",
        description="Ask the replanner only after a task (wave) in which a task failed.",
    )


class VerifyStage(PromptStage):
    """PLAN_EXECUTE verifier: judges the results; `needsMorePlanning` plans again."""

    max_rounds: int = Field(
        3,
        alias="maxRounds",
        gt=0,
        le=10,
        description="Planning rounds at most (the first included) before the summary.",
    )


class SummaryStage(ToolStage):
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


MODE_STAGES: dict[str, tuple[StageName, ...]] = {
    "ONESHOT": ("plain",),
    "REACT": ("react",),
    "PLAN_EXECUTE": ("plan", "execute", "replan", "verify", "summary"),
}
_OPTIONAL_STAGES: frozenset[StageName] = frozenset({"replan", "verify", "summary"})
STAGE_PATHS: dict[StageName, str] = {
    "plain": "plain",
    "react": "react",
    "plan": "planExecute.plan",
    "execute": "planExecute.execute",
    "replan": "planExecute.replan",
    "verify": "planExecute.verify",
    "summary": "planExecute.summary",
}


def _key_optional(schema: dict[str, Any]) -> None:
    """In a file `key` may be omitted: it defaults to the file name."""
    schema["required"] = [name for name in schema["required"] if name != "key"]


class AgentFile(_Strict):
    """An agent file as validated (v2). The file name is the agent key."""

    model_config = ConfigDict(json_schema_extra=_key_optional)

    json_schema_ref: str | None = Field(None, alias="$schema")
    key: AgentKey = Field(description="Optional; must equal the file name without .json.")
    name: str = Field("", description="Display name; defaults to the key.")
    icon: str | None = Field(None, description='e.g. "emoji:🤖"')
    description: str = ""
    examples: list[Annotated[str, StringConstraints(min_length=1, max_length=500)]] = Field(
        default_factory=list,
        max_length=10,
        description=(
            "A few prompts that show what the agent does; clients offer them to click "
            "(the web page shows them when a chat is empty)."
        ),
    )
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
    resumable: bool = Field(
        True,
        description=(
            "Whether a run of this agent resumes from its last completed step when the "
            "process running it stops (it dies, drains or restarts). false: such a run ends "
            "with run.error OWNER_LOST."
        ),
    )
    skills: bool | list[SkillName] = Field(
        False,
        description=(
            "Offer skills (the folders of the skills directory): true for all, or their "
            "names. Their names and descriptions go into the system prompt, and the "
            "`skill` tool loads one's full text."
        ),
    )
    overrides: list[Override] = Field(
        default_factory=list,
        description=(
            "What a query may change for its run (QueryRequest.overrides), named as in this "
            'file: the model ("model", "providerKey"), its settings ("temperature", "top_p", '
            '"max_tokens", "reasoning.enabled", "reasoning.effort") and budgets '
            '("budget.maxModelCalls", …), in every stage. Anything else a query asks to '
            "change is refused. Default: nothing."
        ),
    )
    webhooks: list[Annotated[str, StringConstraints(pattern=r"^https?://\S+$")]] = Field(
        default_factory=list,
        description=(
            "URLs told of the end of every run of this agent (the agw form of webhook "
            "notifications, signed with the service's webhook_secret)."
        ),
    )
    client_tools: bool = Field(
        False,
        alias="clientTools",
        description=(
            "Whether a query may declare tools of its own (QueryRequest.tools, an AG-UI "
            "client's tools): offered to the model as frontend tools, in the stages that run "
            "tools (plain, react, execute), answered by the client. Default: no."
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
    def _check_rules(self, info: ValidationInfo) -> AgentFile:
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
            for stage in MODE_STAGES[mode]:
                if stage not in _OPTIONAL_STAGES:
                    needed.setdefault(stage, f"mode {mode}")
        if self.react is not None and self.react.escalate:
            for stage in ("plan", "execute"):
                needed.setdefault(stage, "react.escalate")
        for stage, by in needed.items():
            if self.stage_config(stage) is None:
                issues.append((STAGE_PATHS[stage], f"is required by {by} (with a systemPrompt)"))
        for stage, path in STAGE_PATHS.items():
            config = self.stage_config(stage)
            for issue in prompt_issues(config.system_prompt) if config is not None else ():
                issues.append((f"{path}.systemPrompt", issue))
        if len(set(self.overrides)) != len(self.overrides):
            issues.append(("overrides", "lists a setting twice"))
        _raise_issues(issues)
        return self

    def stage_config(self, name: StageName) -> PromptStage | None:
        if name == "plain":
            return self.plain
        if name == "react":
            return self.react
        if self.plan_execute is None:
            return None
        stages: dict[str, PromptStage | None] = {
            "plan": self.plan_execute.plan,
            "execute": self.plan_execute.execute,
            "replan": self.plan_execute.replan,
            "verify": self.plan_execute.verify,
            "summary": self.plan_execute.summary,
        }
        return stages[name]


def _raise_issues(issues: list[tuple[str, str]]) -> None:
    """Report rule violations from a validator; `_issues_from` turns them into AgentIssues."""
    if issues:
        text = "; ".join(f"{path}: {reason}" for path, reason in issues)
        raise PydanticCustomError("agent_rule", "{text}", {"text": text, "issues": issues})
