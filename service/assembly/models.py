"""ListModels: the providers and model aliases of the registry, as the contract's messages."""

from __future__ import annotations

from agw.v1 import gateway_pb2 as gw

from service.providers.registry import ProviderRegistry
from service.transport.servicer import ModelCatalog


def model_catalog(registry: ProviderRegistry) -> ModelCatalog:
    """The answer of ListModels, made at each call (the deployments' state of the moment)."""

    async def list_models() -> gw.ListModelsResponse:
        providers = [
            gw.ProviderInfo(key=p.key, api=p.api, default_model=p.default_model)
            for p in registry.providers()
        ]
        aliases = [
            gw.ModelAlias(
                name=a.name,
                strategy=a.strategy,
                restart_on_failure=a.restart_on_failure,
                deployments=[
                    gw.Deployment(
                        name=d.name,
                        provider=d.provider,
                        model=d.model,
                        weight=d.weight,
                        state=d.state,
                        reason=d.reason,
                        retry_at_ms=d.retry_at_ms,
                        in_flight=d.in_flight,
                        rpm_limit=d.rpm_limit,
                        tpm_limit=d.tpm_limit,
                        rpm_used=d.rpm_used,
                        tpm_used=d.tpm_used,
                        latency_ms=d.latency_ms,
                        calls=d.calls,
                        failures=d.failures,
                        context_length=d.context_length,
                    )
                    for d in a.deployments
                ],
            )
            for a in await registry.alias_statuses()
        ]
        return gw.ListModelsResponse(providers=providers, aliases=aliases)

    return list_models
