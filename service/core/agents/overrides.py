"""A query's overrides: settings of the agent replaced for one run, where the agent allows.

An agent file lists in `overrides` what a query may change (`QueryRequest.overrides`),
named as in the file: `model`, `providerKey`, `temperature`, `top_p`, `max_tokens`,
`reasoning.enabled`, `reasoning.effort` (each applies to every stage: the outer
`modelConfig` and every stage's own) and `budget.maxModelCalls`, `budget.maxToolCalls`,
`budget.maxSteps`, `budget.timeoutMs`. A query asking for anything else, or for a value
the file itself could not hold (a temperature of 3), is refused before the run starts.
The agent with its overrides is what the run journals, so a resumed run keeps them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from service.core.agents.definition import AgentDefinition
from service.core.agents.schema import (
    Budget,
    ModelConfig,
    Override,
    PlanExecuteConfig,
    PromptStage,
    ReasoningConfig,
)
from service.core.errors import InvalidRequest

#: Every name an agent may list in `overrides`.
OVERRIDES: tuple[str, ...] = get_args(Override)
_MODEL = {"model": "model", "providerKey": "provider_key", "temperature": "temperature"}
_MODEL |= {"top_p": "top_p", "max_tokens": "max_tokens"}
_REASONING = {"reasoning.enabled": "enabled", "reasoning.effort": "effort"}
_BUDGET = {
    "budget.maxModelCalls": "max_model_calls",
    "budget.maxToolCalls": "max_tool_calls",
    "budget.maxSteps": "max_steps",
    "budget.timeoutMs": "timeout_ms",
}
_PLAN_STAGES = ("plan", "execute", "replan", "verify", "summary")


def with_overrides(agent: AgentDefinition, overrides: Mapping[str, Any] | None) -> AgentDefinition:
    """`agent` with `overrides` applied; InvalidRequest naming what it does not allow."""
    if not overrides:
        return agent
    unknown = [name for name in overrides if name not in OVERRIDES]
    if unknown:
        raise InvalidRequest(
            f"overrides: unknown setting {unknown[0]!r} (a query may override "
            f"{', '.join(OVERRIDES)}, where the agent allows)"
        )
    refused = [name for name in overrides if name not in agent.overrides]
    if refused:
        allowed = ", ".join(agent.overrides) or "nothing"
        raise InvalidRequest(
            f"agent {agent.key!r} does not allow a query to override {', '.join(refused)} "
            f'(it allows {allowed}: the settings its file lists in "overrides")',
            agent_key=agent.key,
        )
    model = _valid(ModelConfig, _MODEL, overrides)
    reasoning = _valid(ReasoningConfig, _REASONING, overrides)
    budget = _valid(Budget, _BUDGET, overrides)
    update: dict[str, Any] = {}
    if model or reasoning:
        update["model_config_"] = _model(agent.model_config_ or ModelConfig(), model, reasoning)
        for name in ("plain", "react"):
            stage = getattr(agent, name)
            if stage is not None and stage.model_config_ is not None:
                update[name] = _stage(stage, model, reasoning)
        if agent.plan_execute is not None:
            update["plan_execute"] = _plan_execute(agent.plan_execute, model, reasoning)
    if budget:
        update["budget"] = agent.budget.model_copy(update=budget)
    return agent.copy_with(update)  # its stages resolved anew, with the overrides


def _valid(
    model: type[BaseModel], names: dict[str, str], given: Mapping[str, Any]
) -> dict[str, Any]:
    """The overrides among `names`, by field, checked as the agent file's own values are."""
    fields = {names[name]: value for name, value in given.items() if name in names}
    if not fields:
        return {}
    by_alias = {(model.model_fields[f].alias or f): value for f, value in fields.items()}
    try:
        model.model_validate(by_alias)
    except ValidationError as error:
        issue = error.errors(include_url=False)[0]
        field = next(
            n for n, f in names.items() if (model.model_fields[f].alias or f) in issue["loc"]
        )
        raise InvalidRequest(f"overrides: {field}: {issue['msg']} (got {given[field]!r})") from None
    return fields


def _model(config: ModelConfig, fields: dict[str, Any], reasoning: dict[str, Any]) -> ModelConfig:
    update = dict(fields)
    if reasoning:
        update["reasoning"] = (config.reasoning or ReasoningConfig()).model_copy(update=reasoning)
    return config.model_copy(update=update)


def _stage(stage: PromptStage, fields: dict[str, Any], reasoning: dict[str, Any]) -> PromptStage:
    if stage.model_config_ is None:
        return stage
    return stage.model_copy(
        update={"model_config_": _model(stage.model_config_, fields, reasoning)}
    )


def _plan_execute(
    config: PlanExecuteConfig, fields: dict[str, Any], reasoning: dict[str, Any]
) -> PlanExecuteConfig:
    stages = {name: getattr(config, name) for name in _PLAN_STAGES}
    update = {n: _stage(s, fields, reasoning) for n, s in stages.items() if s is not None}
    return config.model_copy(update=update)
