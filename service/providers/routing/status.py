"""What ListModels shows of the aliases: each deployment's state, limits and counts."""

from __future__ import annotations

from dataclasses import dataclass

from service.providers.routing.router import AliasClient


@dataclass(frozen=True, slots=True)
class DeploymentStatus:
    name: str
    provider: str
    model: str
    weight: float
    state: str  # healthy | cooling_down | probing | limited
    reason: str
    retry_at_ms: int
    in_flight: int
    rpm_limit: int
    tpm_limit: int
    rpm_used: int
    tpm_used: int
    latency_ms: float
    calls: int
    failures: int
    context_length: int


@dataclass(frozen=True, slots=True)
class AliasStatus:
    name: str
    strategy: str
    restart_on_failure: bool
    deployments: tuple[DeploymentStatus, ...]


async def alias_status(alias: AliasClient) -> AliasStatus:
    """The alias and the state of each of its deployments now."""
    now = alias.clock()
    out = []
    for deployment in alias.deployments:
        options = deployment.options
        used = await alias.limiter.usage(options)
        state = deployment.state(now)
        reason = deployment.breaker.reason
        at_rpm = bool(options.rpm and used.calls >= options.rpm)
        at_tpm = bool(options.tpm and used.tokens >= options.tpm)
        if state == "healthy" and (at_rpm or at_tpm):
            state = "limited"
            limit = options.rpm if at_rpm else options.tpm
            reason = f"at its limit of {limit} {'calls' if at_rpm else 'tokens'} a minute"
        cooling = state == "cooling_down"
        out.append(
            DeploymentStatus(
                name=options.name,
                provider=options.provider,
                model=options.model,
                weight=options.weight,
                state=state,
                reason=reason,
                retry_at_ms=round(deployment.breaker.wall * 1000) if cooling else 0,
                in_flight=used.in_flight,
                rpm_limit=options.rpm,
                tpm_limit=options.tpm,
                rpm_used=used.calls,
                tpm_used=used.tokens,
                latency_ms=round(deployment.latency_s * 1000, 1),
                calls=deployment.calls,
                failures=deployment.failures,
                context_length=options.context_length,
            )
        )
    alias_options = alias.options
    return AliasStatus(
        alias_options.name, alias_options.strategy, alias_options.restart_on_failure, tuple(out)
    )
