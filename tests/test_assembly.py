"""The assembly: every setting reaches the plain options of the providers and built-in tools."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from pydantic import SecretStr

from service.assembly.app import App, bash_options, provider_options
from service.assembly.config import ProviderSettings, Settings
from service.builtins.bash import BashOptions
from service.providers.anthropic_wire import AnthropicWire
from service.providers.http import StreamingClient
from service.providers.openai import OpenAIChatClient, ProviderOptions

CONFIGURED = ProviderSettings(
    base_url="http://upstream.example/v1",
    api_key=SecretStr("sk-configured"),
    default_model="m-1",
    api="anthropic",
    reasoning_style="think",
    max_tokens=1000,
    extra_body={"seed": 7},
    headers={"X-Team": "a"},
    connect_timeout_s=1.5,
    read_timeout_s=2.5,
    max_retries=5,
    retry_backoff_s=0.25,
    max_retry_after_s=90,
    max_connections=3,
    secret_headers=("X-Org",),
    max_sse_line_bytes=1000,
    max_sse_event_bytes=2000,
    image_input=True,
)


def test_provider_options_carry_every_provider_setting() -> None:
    options = provider_options(CONFIGURED)
    unset = ProviderOptions(base_url="")
    for f in fields(ProviderOptions):
        assert getattr(options, f.name) == getattr(CONFIGURED, f.name), f.name
        assert getattr(options, f.name) != getattr(unset, f.name), f"{f.name} is not exercised"


def test_provider_options_default_to_the_settings_defaults() -> None:
    assert provider_options(ProviderSettings(base_url="u")) == ProviderOptions(base_url="u")


def test_bash_options_carry_every_bash_setting(tmp_path: Path) -> None:
    settings = Settings(
        bash_working_dir=tmp_path / "work",
        bash_allowed_paths=[tmp_path / "a", tmp_path / "b"],
        bash_timeout_s=3.0,
        bash_output_limit_bytes=100,
        bash_memory_limit_bytes=1024,
        bash_max_processes=2,
        bash_network=True,
        bash_workspace_quota_bytes=4096,
        bash_max_concurrent=2,
    )
    options = bash_options(settings)
    assert options == BashOptions(
        working_dir=tmp_path / "work",
        allowed_paths=(tmp_path / "a", tmp_path / "b"),
        timeout_s=3.0,
        output_limit_bytes=100,
        memory_limit_bytes=1024,
        max_processes=2,
        network=True,
        workspace_quota_bytes=4096,
        max_concurrent=2,
    )
    unset = BashOptions(working_dir=Path())
    for f in fields(BashOptions):
        assert getattr(options, f.name) != getattr(unset, f.name), f"{f.name} is not exercised"


def test_bash_options_default_to_the_settings_defaults(tmp_path: Path) -> None:
    assert bash_options(Settings(bash_working_dir=tmp_path)) == BashOptions(working_dir=tmp_path)


async def test_the_app_opens_each_provider_with_its_options_and_the_log_switches(
    tmp_path: Path,
) -> None:
    settings = Settings(
        agents_dir=tmp_path / "agents",
        tools_dir=tmp_path / "tools",
        data_dir=tmp_path / "data",
        providers={"main": CONFIGURED, "other": ProviderSettings(base_url="http://other/v1")},
        default_provider="other",
        interaction_log_enabled=False,
        interaction_log_mask_sensitive=False,
        grpc_address="127.0.0.1:0",  # never the default ports, which a running service may hold
        http_enabled=False,
    )
    app = App(settings)
    try:
        assert app.providers.keys() == ["main", "other"]
        assert app.providers.default_key == "other"
        assert app.providers.default_model("main") == "m-1"
        client = app.providers.get("main")
        assert isinstance(client, StreamingClient)  # the interaction log is off: not wrapped
        assert isinstance(client.wire, AnthropicWire)  # the API the provider speaks
        assert client.options == provider_options(CONFIGURED)
        assert isinstance(app.providers.get("other"), OpenAIChatClient)
    finally:
        await app.providers.aclose()


def test_the_upload_store_follows_the_chat_store_unless_set(tmp_path: Path) -> None:
    def store(**settings: object) -> str:
        return Settings(data_dir=tmp_path, **settings).upload_store_name  # type: ignore[arg-type]

    assert store() == "files"
    assert store(chat_store="memory") == "files"
    assert store(chat_store="postgres") == "postgres"  # replicas share their uploads
    assert store(chat_store="postgres", upload_store="files") == "files"
    assert store(upload_store="memory") == "memory"
