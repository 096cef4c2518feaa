"""The client of an OpenAI-compatible provider: the streaming HTTP client on OpenAI's wire."""

from __future__ import annotations

from service.providers.http import ProviderOptions, StreamingClient
from service.providers.openai_wire import OpenAIWire

__all__ = ["OpenAIChatClient", "ProviderOptions"]


class OpenAIChatClient(StreamingClient):
    """`ModelClient` for one OpenAI-compatible provider (`key` names it in every error)."""

    def __init__(self, key: str, options: ProviderOptions) -> None:
        super().__init__(key, options, OpenAIWire(options.reasoning_style, options.extra_body))
