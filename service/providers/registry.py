"""The providers by key: one pooled client each, built from their options or registered."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from service.core.errors import ProviderNotConfigured
from service.core.model import ModelClient
from service.providers.anthropic_wire import AnthropicWire
from service.providers.gemini_wire import GeminiWire
from service.providers.http import ProviderOptions, StreamingClient
from service.providers.interaction_log import LoggedModel
from service.providers.openai import OpenAIChatClient


def open_client(key: str, options: ProviderOptions) -> StreamingClient:
    """The client of a provider, speaking its API."""
    if options.api == "anthropic":
        return StreamingClient(key, options, AnthropicWire(options.max_tokens, options.extra_body))
    if options.api == "gemini":
        return StreamingClient(key, options, GeminiWire(options.extra_body))
    return OpenAIChatClient(key, options)


class ProviderRegistry:
    """Key → ModelClient, with the default provider and each provider's default model.

    `providers` are the providers to open a client for (each speaking its API);
    `log_enabled` and `log_mask` switch the interaction log and its masking: when it is
    on, every client, opened here or registered, is wrapped in a `LoggedModel`.
    """

    def __init__(
        self,
        providers: Mapping[str, ProviderOptions] | None = None,
        *,
        default_provider: str = "",
        log_enabled: bool = True,
        log_mask: bool = True,
    ) -> None:
        self._clients: dict[str, ModelClient] = {}
        self._models: dict[str, str] = {}
        self._default = default_provider
        self._log_enabled, self._log_mask = log_enabled, log_mask
        for key, options in (providers or {}).items():
            self.register(key, open_client(key, options), default_model=options.default_model)

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
        """The client of `key` ("" means the default provider)."""
        client = self._clients.get(key or self.default_key)
        if client is None:
            configured = ", ".join(sorted(self._clients)) or "none"
            raise ProviderNotConfigured(
                f"provider {key or self.default_key!r} is not configured "
                f"(configured providers: {configured})",
                provider=key,
            )
        return client

    def default_model(self, key: str) -> str:
        """The provider's default model ("" when it has none or is unknown)."""
        return self._models.get(key or self.default_key, "")

    async def aclose(self) -> None:
        """Close every client's connection pool."""
        clients = list(self._clients.values())
        results = await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result
