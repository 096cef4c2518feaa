"""Settings: the one place that reads the environment.

Every setting has an embedded default, can be set by an `AGW_`-prefixed
environment variable (nested with `__`, e.g. `AGW_PROVIDERS__OPENAI__API_KEY`),
or in a TOML file named by `AGW_CONFIG_FILE` (default `agw.toml` when present).
Environment variables win over the file. Secrets are `SecretStr`: they print
as `**********` and never reach a log line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

ReasoningStyle = Literal[
    "reasoning_effort", "enable_thinking", "chat_template_kwargs", "think", "none"
]


class ProviderSettings(BaseModel):
    """One OpenAI-compatible provider."""

    base_url: str = Field(description="Base URL up to /v1, e.g. https://api.openai.com/v1")
    api_key: SecretStr = SecretStr("")
    default_model: str = ""
    # How this provider switches reasoning on:
    #   reasoning_effort     -> {"reasoning_effort": "low|medium|high"} (OpenAI o-series, DeepSeek)
    #   enable_thinking      -> {"enable_thinking": true} (Qwen / Bailian, SiliconFlow)
    #   chat_template_kwargs -> {"chat_template_kwargs": {"enable_thinking": true}} (vLLM)
    #   think                -> {"think": true} (Ollama)
    #   none                 -> nothing is sent
    reasoning_style: ReasoningStyle = "reasoning_effort"
    extra_body: dict[str, Any] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    max_retries: int = 2
    retry_backoff_s: float = 0.5
    max_connections: int = 200


class Settings(BaseSettings):
    """The service's settings (see README for the full table)."""

    model_config = SettingsConfigDict(
        env_prefix="AGW_",
        env_nested_delimiter="__",
        extra="ignore",
        toml_file=os.environ.get("AGW_CONFIG_FILE", "agw.toml"),
    )

    # Network
    grpc_address: str = "127.0.0.1:50051"
    max_concurrent_runs: int = 1000
    keepalive_time_s: float = 60.0
    shutdown_grace_s: float = 10.0

    # Agents
    agents_dir: Path = Path("agents")
    agents_watch: bool = True

    # Providers; when none is configured the built-in demo provider serves every agent.
    providers: dict[str, ProviderSettings] = Field(default_factory=dict)
    default_provider: str = ""
    demo_delay_ms: float = 20.0

    # Interaction log of every model call (logged at DEBUG under "agw.llm").
    interaction_log_enabled: bool = True
    interaction_log_mask_sensitive: bool = True

    # Logging
    log_level: str = "INFO"
    log_format: Literal["text", "json"] = "text"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))
