"""The providers by key: one pooled client each, built from their options or registered;
and the model aliases, whose clients route each call to one of their deployments.

A deployment calls its provider through a client of its own (per provider, key and
retries): with one of the provider's named keys (`keys`) and, by default, no retries of
its own — the alias moves a failed call to its next deployment instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from pydantic import SecretStr

from service.core.errors import ProviderNotConfigured
from service.core.model import ModelClient
from service.providers.anthropic_wire import AnthropicWire
from service.providers.gemini_wire import GeminiWire
from service.providers.http import ProviderOptions, StreamingClient
from service.providers.interaction_log import LoggedModel
from service.providers.openai import OpenAIChatClient
from service.providers.routing.deployment import AliasOptions, Deployment, DeploymentOptions
from service.providers.routing.limits import Limiter, LocalLimiter
from service.providers.routing.router import AliasClient
from service.providers.routing.status import AliasStatus, alias_status


def open_client(key: str, options: ProviderOptions) -> StreamingClient:
    """The client of a provider, speaking its API."""
    if options.api == "anthropic":
        return StreamingClient(key, options, AnthropicWire(options.max_tokens, options.extra_body))
    if options.api == "gemini":
        return StreamingClient(key, options, GeminiWire(options.extra_body))
    return OpenAIChatClient(key, options)


@dataclass(frozen=True, slots=True)
class ProviderStatus:
    key: str
    api: str
    default_model: str


class ProviderRegistry:
    """Key → ModelClient, with the default provider and each provider's default model.

    `providers` are the providers to open a client for (each speaking its API);
    `log_enabled` and `log_mask` switch the interaction log and its masking: when it is
    on, every client, opened here or registered, is wrapped in a `LoggedModel`.
    `deployments` and `aliases` are the model aliases (their deployments' providers are
    among `providers`, which may have named keys of their own in `keys`); `limiter`
    holds their rate limits (default: this process's).
    """

    def __init__(
        self,
        providers: Mapping[str, ProviderOptions] | None = None,
        *,
        default_provider: str = "",
        log_enabled: bool = True,
        log_mask: bool = True,
        deployments: Sequence[DeploymentOptions] = (),
        aliases: Sequence[AliasOptions] = (),
        keys: Mapping[str, Mapping[str, SecretStr]] | None = None,
        limiter: Limiter | None = None,
    ) -> None:
        self._clients: dict[str, ModelClient] = {}
        self._models: dict[str, str] = {}
        self._default = default_provider
        self._log_enabled, self._log_mask = log_enabled, log_mask
        self._options = dict(providers or {})
        self._aliases: dict[str, AliasClient] = {}
        self._deployment_clients: dict[tuple[str, str, int], ModelClient] = {}
        self.limiter: Limiter = limiter or LocalLimiter()
        for key, options in self._options.items():
            self.register(key, open_client(key, options), default_model=options.default_model)
        if aliases:
            self._route(deployments, aliases, keys or {})

    def _route(
        self,
        deployments: Sequence[DeploymentOptions],
        aliases: Sequence[AliasOptions],
        keys: Mapping[str, Mapping[str, SecretStr]],
    ) -> None:
        """Open each deployment's client and each alias's (a bad reference raises)."""
        by_name: dict[str, Deployment] = {}
        for options in deployments:
            provider = self._options.get(options.provider)
            if provider is None:
                raise ValueError(
                    f"deployment {options.name!r} names provider {options.provider!r}, "
                    "which is not configured"
                )
            named = keys.get(options.provider, {})
            if options.key and options.key not in named:
                raise ValueError(
                    f"deployment {options.name!r} names key {options.key!r}, which provider "
                    f"{options.provider!r} does not have"
                )
            client = self._deployment_client(options, provider, named.get(options.key))
            by_name[options.name] = Deployment(options, client)
        for alias in aliases:
            if alias.name in self._clients:
                raise ValueError(f"alias {alias.name!r} has the name of a provider")
            missing = [name for name in alias.deployments if name not in by_name]
            if missing or not alias.deployments:
                raise ValueError(f"alias {alias.name!r} names unknown deployments: {missing}")
            chosen = [by_name[name] for name in alias.deployments]
            self._aliases[alias.name] = AliasClient(alias, chosen, self.limiter)

    def _deployment_client(
        self, options: DeploymentOptions, provider: ProviderOptions, key: SecretStr | None
    ) -> ModelClient:
        """The client of a deployment: shared by the deployments of one provider, key and
        number of retries."""
        ident = (options.provider, options.key, options.max_retries)
        client = self._deployment_clients.get(ident)
        if client is None:
            opened = replace(provider, max_retries=options.max_retries)
            if key is not None:
                opened = replace(opened, api_key=key)
            client = open_client(options.provider, opened)
            if self._log_enabled:
                client = LoggedModel(client, mask_sensitive=self._log_mask)
            self._deployment_clients[ident] = client
        return client

    def register(self, key: str, client: ModelClient, *, default_model: str | None = None) -> None:
        """Add (or replace) a provider, logged when the interaction log is on; its default
        model defaults to its options' one."""
        if default_model is None:
            default_model = (
                client.options.default_model if isinstance(client, StreamingClient) else ""
            )
        if self._log_enabled:
            client = LoggedModel(client, mask_sensitive=self._log_mask)
        self._clients[key] = client
        self._models[key] = default_model

    @property
    def default_key(self) -> str:
        """`default_provider` when given, else the only (or first) provider, else ""."""
        return self._default or next(iter(self._clients), "")

    def keys(self) -> list[str]:
        return list(self._clients)

    def __contains__(self, key: object) -> bool:
        return key in self._clients

    def get(self, key: str) -> ModelClient:
        """The client of `key`, a provider or a model alias ("" means the default provider)."""
        key = key or self.default_key
        client = self._clients.get(key) or self._aliases.get(key)
        if client is None:
            configured = ", ".join(sorted(self._clients)) or "none"
            raise ProviderNotConfigured(
                f"provider {key or self.default_key!r} is not configured "
                f"(configured providers: {configured})",
                provider=key,
            )
        return client

    def default_model(self, key: str) -> str:
        """The provider's default model ("" when it has none or is unknown); an alias's is
        its own name."""
        key = key or self.default_key
        return key if key in self._aliases else self._models.get(key, "")

    def alias_key(self, model: str) -> str:
        """`model` when it is an alias's name, else ""."""
        return model if model in self._aliases else ""

    def aliases(self) -> list[AliasClient]:
        return list(self._aliases.values())

    def providers(self) -> list[ProviderStatus]:
        """The providers opened from their options (the registered ones have none)."""
        return [
            ProviderStatus(key, options.api, options.default_model)
            for key, options in self._options.items()
        ]

    async def alias_statuses(self) -> list[AliasStatus]:
        return [await alias_status(alias) for alias in self._aliases.values()]

    async def aclose(self) -> None:
        """Close every client's connection pool, and the limiter's."""
        clients = [*self._clients.values(), *self._deployment_clients.values()]
        closing = [c.aclose() for c in clients] + [self.limiter.aclose()]
        results = await asyncio.gather(*closing, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result
