"""Each stage's model, bound once per run: the provider's client and the model's name.

A query binds every stage its agent may run before the run starts, so that an
unknown provider or a stage without a model is refused at once (the query fails
with a status, no run is started); the run's model calls then only build their
request from the bound model and the stage's settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from service.core.agents.definition import AgentDefinition, ResolvedStage
from service.core.agents.schema import StageName
from service.core.errors import InvalidRequest
from service.core.model import ModelClient, ModelRequest, ModelRouter

#: A stage's name in the chat records and logs, where it differs from the agent file's.
STAGE_LABELS = {"plain": "oneshot"}


@dataclass(frozen=True, slots=True)
class BoundModel:
    """The provider, its client and the model one stage of a run calls."""

    provider: str
    model: str
    client: ModelClient

    def request(
        self,
        stage: ResolvedStage,
        messages: list[dict[str, Any]],
        run_id: str = "",
        **options: Any,
    ) -> ModelRequest:
        """The request of a call of `stage` with `messages` (`options` set request fields)."""
        cfg = stage.model
        request = ModelRequest(
            provider=self.provider,
            model=self.model,
            messages=messages,
            reasoning=cfg.reasoning,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_tokens=cfg.max_tokens,
            extra_body=cfg.body_for(self.provider),
            run_id=run_id,
            stage=STAGE_LABELS.get(stage.name, stage.name),
        )
        for key, value in options.items():
            setattr(request, key, value)
        return request


def bind(models: ModelRouter, stage: ResolvedStage) -> BoundModel:
    """The model `stage` calls: the stage's provider and model, else the service's defaults.

    A stage that names a model and no provider may name a model alias: its client is the
    alias's (which routes each call to one of its deployments)."""
    cfg = stage.model
    alias = models.alias_key(cfg.model) if cfg.model and not cfg.provider_key else ""
    provider = cfg.provider_key or alias or models.default_key
    client = models.get(provider)
    model = cfg.model or models.default_model(provider)
    if not model:
        raise InvalidRequest(
            f"stage {stage.name!r} names no model and provider {provider!r} has no default_model",
            provider=provider,
        )
    return BoundModel(provider, model, client)


def bind_stages(models: ModelRouter, agent: AgentDefinition) -> Mapping[StageName, BoundModel]:
    """The model of every stage `agent` may run (an unknown provider raises here)."""
    return {name: bind(models, agent.stage(name)) for name in agent.stage_names}
