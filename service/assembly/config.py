"""Settings: the one place that reads the environment.

Every setting has an embedded default, can be set by an `AGW_`-prefixed
environment variable (nested with `__`, e.g. `AGW_PROVIDERS__OPENAI__API_KEY`),
or in a TOML file named by `AGW_CONFIG_FILE` (default `agw.toml` when present).
Environment variables win over the file. Secrets are `SecretStr`: they print
as `**********` and never reach a log line.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from service.process.eventloop import EventLoopChoice
from service.providers.http import ApiName
from service.providers.openai_wire import ReasoningStyle
from service.providers.routing.deployment import Strategy

#: The base URL of a provider that sets none, by the API it speaks.
DEFAULT_BASE_URLS: dict[str, str] = {
    "anthropic": "https://api.anthropic.com/v1",
    "gemini": "https://generativelanguage.googleapis.com/v1beta",
}


class ProviderSettings(BaseModel):
    """One provider: an OpenAI-compatible endpoint, Anthropic's Messages API or Gemini's."""

    # The wire it speaks: "openai" (chat completions, and every compatible server),
    # "anthropic" (the Messages API) or "gemini" (streamGenerateContent).
    api: ApiName = "openai"
    base_url: str = Field(
        "",
        description="Base URL up to the API version, e.g. https://api.openai.com/v1 "
        "(default for anthropic and gemini: their public endpoints)",
    )
    api_key: SecretStr = SecretStr("")
    default_model: str = ""
    # The answer's length when an agent sets no max_tokens, for APIs that need one (Anthropic).
    max_tokens: int = Field(8192, gt=0)
    # How this provider switches reasoning on:
    #   reasoning_effort     -> {"reasoning_effort": "low|medium|high"} (OpenAI o-series, DeepSeek)
    #   enable_thinking      -> {"enable_thinking": true} (Qwen / Bailian, SiliconFlow)
    #   chat_template_kwargs -> {"chat_template_kwargs": {"enable_thinking": true}} (vLLM)
    #   think                -> {"think": true} (Ollama)
    #   none                 -> nothing is sent
    reasoning_style: ReasoningStyle = "reasoning_effort"
    extra_body: dict[str, Any] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    # Names of `headers` whose values are secrets, masked by value in logs and errors
    # (headers whose names contain auth, key, token, secret, password or cookie always are).
    secret_headers: tuple[str, ...] = ()
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    max_retries: int = 2
    retry_backoff_s: float = 0.5
    # The longest wait before a retry: a `Retry-After` beyond it fails the call at once
    # (naming it) instead of being cut short and refused again.
    max_retry_after_s: float = Field(30.0, ge=0)
    max_connections: int = 200
    # Bounds of the provider's event stream; a provider that breaks one fails the run
    # with PROVIDER_ERROR: the longest line (1 MiB) and the largest data of one event (4 MiB).
    max_sse_line_bytes: int = Field(1024 * 1024, gt=0)
    max_sse_event_bytes: int = Field(4 * 1024 * 1024, gt=0)
    # Whether the provider's models accept image content parts (uploaded images are sent).
    image_input: bool = False
    # More keys of the provider, by name, for its deployments (`DeploymentSettings.key`).
    keys: dict[str, SecretStr] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _base_url(self) -> ProviderSettings:
        if not self.base_url:
            if self.api not in DEFAULT_BASE_URLS:
                raise ValueError("an OpenAI-compatible provider needs its base_url")
            self.base_url = DEFAULT_BASE_URLS[self.api]
        return self


class ModelPrice(BaseModel):
    """What a model costs, per million tokens."""

    input_per_million: float = 0.0
    output_per_million: float = 0.0
    cached_input_per_million: float | None = None  # default: the input price


class DeploymentSettings(BaseModel):
    """One deployment of model aliases: a provider's model (README "Model aliases")."""

    provider: str  # a key of `providers`
    model: str
    key: str = ""  # a name in the provider's `keys`; default: its api_key
    weight: float = Field(1.0, gt=0)  # its share under the "weighted" strategy
    rpm: int = Field(0, ge=0)  # calls per minute; 0: no limit
    tpm: int = Field(0, ge=0)  # tokens per minute; 0: no limit
    context_length: int = Field(0, ge=0)  # tokens; 0: unknown
    price: ModelPrice | None = None  # also the price of its model in `prices`, unless set there
    max_retries: int = Field(0, ge=0)  # its own retries; 0: the alias moves on instead
    cooldown_s: float = Field(30.0, gt=0)  # after a failure (unless a Retry-After says)
    max_cooldown_s: float = Field(600.0, gt=0)  # the cool-down doubles up to this


class AliasSettings(BaseModel):
    """A model alias: deployments in order of preference (README "Model aliases")."""

    deployments: list[str] = Field(min_length=1)
    strategy: Strategy = "ordered"  # or "weighted", "least_busy", "latency"
    # A call that fails after its first delta starts over on the next deployment.
    restart_on_failure: bool = False


class QuotaSettings(BaseModel):
    """Limits of a tenant or an API key (README "Quotas and spend"); unset: no limit."""

    concurrent_runs: int | None = Field(default=None, ge=0)
    requests_per_minute: int | None = Field(default=None, ge=0)  # queries started
    tokens_per_day: int | None = Field(default=None, ge=0)  # prompt + completion, UTC days
    spend_per_month: float | None = Field(default=None, ge=0)  # in `currency`, UTC months


class ApiKeySettings(BaseModel):
    """One accepted API key and whom it stands for."""

    key: SecretStr = Field(description="the key in clear, or 'sha256:<hex digest>'")
    tenant: str = "default"
    subject: str
    name: str = ""  # the key's name in quotas and the spend ledger; default: its subject
    roles: list[str] = Field(default_factory=list)  # e.g. ["admin"] (README "Roles")
    quota: QuotaSettings | None = None  # the key's own limits, besides its tenant's


class McpServerSettings(BaseModel):
    """One MCP server whose tools the service offers (docs/agents.md, "Tool sources: MCP and HTTP").

    Values of `env` and `headers` may hold `${ENV:NAME}` references to the service's
    environment (for credentials); they are resolved at each connection. The `url`
    holds no credentials (HTTP clients log it).
    """

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    transport: Literal["stdio", "http"] = "stdio"
    command: str = ""  # stdio
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str = ""
    url: str = ""  # http (streamable HTTP)
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(30.0, gt=0)  # a tool call
    tool_prefix: str | None = None  # default "mcp__{name}__"; "" for the tools' own names
    title: str = ""
    icon: str = ""
    connect_timeout_s: float = Field(10.0, gt=0)
    max_output_bytes: int = Field(64 * 1024, gt=0)
    ping_interval_s: float = Field(10.0, gt=0)
    reconnect_min_s: float = Field(1.0, gt=0)
    reconnect_max_s: float = Field(60.0, gt=0)

    @model_validator(mode="after")
    def _transport_fields(self) -> McpServerSettings:
        if self.transport == "stdio" and not self.command:
            raise ValueError(f"MCP server {self.name!r}: a stdio server needs a command")
        if self.transport == "http" and not self.url:
            raise ValueError(f"MCP server {self.name!r}: an http server needs a url")
        if "${ENV:" in self.url:
            raise ValueError(f"MCP server {self.name!r}: put credentials in headers, not the url")
        return self


#: The example MCP server (the demo_mcp agent's clock), served when AGW_MCP_SERVERS is unset
#: and the service runs from the repository's root, as `make run` does.
EXAMPLE_MCP_SERVER = Path("examples") / "mcp" / "clock_server.py"


class CannotStart(Exception):
    """The service cannot start as set; the message is one line naming the setting to change."""


class SettingsProblem(CannotStart):
    """The settings cannot be read."""


class Settings(BaseSettings):
    """The service's settings (the full table: docs/settings.md)."""

    model_config = SettingsConfigDict(
        env_prefix="AGW_",
        env_nested_delimiter="__",
        extra="ignore",
        toml_file=os.environ.get("AGW_CONFIG_FILE", "agw.toml"),
    )

    # Process: the event loop, "auto" (uvloop where available), "asyncio" or "uvloop"
    event_loop: EventLoopChoice = "auto"
    # Worker processes serving the same ports (docs/scale-out.md, Workers): 1 is this process
    # alone; N > 1 makes `python -m service` a supervisor of N workers; 0 or "auto": one per CPU.
    workers: int = Field(default=1, ge=0)
    # Bind the gRPC and HTTP ports with SO_REUSEPORT (the supervisor sets it for its workers).
    reuse_port: bool = False
    # The name a supervisor gives its worker (w0, w1, w0.1 once restarted): tags its log lines.
    worker_name: str = ""

    # Network
    grpc_address: str = "127.0.0.1:50051"
    max_concurrent_runs: int = 1000
    max_concurrent_rpcs: int = 0  # calls in flight before gRPC refuses more; 0: runs + 256
    max_message_bytes: int = 1024 * 1024  # a query's message (UTF-8) beyond this is refused
    keepalive_time_s: float = 60.0
    shutdown_grace_s: float = 10.0
    # On SIGTERM, health says NOT_SERVING at once; the runs another replica can take over at
    # once (the Redis run bus, a shared journal) are handed over this much later (at most
    # shutdown_grace_s), once load balancers have stopped sending calls here.
    drain_delay_s: float = Field(2.0, ge=0)
    grpc_heartbeat_s: float = Field(10.0, ge=0)  # a heartbeat event after this silence; 0: off

    # HTTP/SSE adapter and web page (routes from the proto's google.api.http annotations)
    http_enabled: bool = True
    http_address: str = "127.0.0.1:8080"
    http_grpc_target: str = ""  # the gRPC service it calls; empty: this process's own server
    http_heartbeat_s: float = 10.0  # SSE comment after this much silence
    http_write_timeout_s: float = 30.0  # an SSE client that reads nothing this long is dropped
    http_max_body_bytes: int = 16 * 1024 * 1024
    http_cors_origins: list[str] = Field(default_factory=list)  # "*" allows any origin
    # Host headers served (against DNS rebinding): "name" (any port), "name:port",
    # ".domain" (and its subdomains), "*" (any); the bound address's host is added.
    http_allowed_hosts: list[str] = Field(
        default_factory=lambda: ["localhost", "127.0.0.1", "[::1]"]
    )

    # Security (docs/security.md): credentials in the `authorization` header, TLS
    auth_api_keys: list[ApiKeySettings] = Field(default_factory=list)
    auth_jwt_jwks_url: str = ""  # an OIDC issuer's JWKS URL
    auth_jwt_public_key: str = ""  # or a PEM public key
    auth_jwt_secret: SecretStr = SecretStr("")  # or an HMAC secret
    auth_jwt_algorithms: list[str] = Field(default_factory=list)  # default: by the key kind
    auth_jwt_issuer: str = ""
    auth_jwt_audience: str = ""
    auth_jwt_tenant_claim: str = "tenant"  # the claim naming the tenant; `sub` is the subject
    auth_jwt_roles_claim: str = "roles"  # the claim naming the caller's roles ("admin", ...)
    allow_unauthenticated: bool = False  # serve a non-loopback address with no credentials
    tls_cert_file: Path | None = None  # PEM certificate chain: serve gRPC and HTTP over TLS
    tls_key_file: Path | None = None

    # Agents
    agents_dir: Path = Path("agents")
    agents_watch: bool = True
    # The agent store (README "Agents in the database"): `files` (agents come from the
    # directory alone), `memory` or `postgres` (created, updated and rolled back through
    # calls, with versions, served by every replica; polled every agent_store_poll_s besides
    # PostgreSQL's notifications). With `agent_store_seed`, the directory's agents that the
    # store lacks are written to it at start-up.
    agent_store: Literal["files", "memory", "postgres"] = "files"
    agent_store_seed: bool = False
    agent_store_poll_s: float = Field(default=5.0, gt=0)
    # Skills: one folder per skill with its SKILL.md, watched like the agents
    skills_dir: Path = Path("skills")

    # Tools: tool files (*.backend, *.action, *.html, *.qlc, *.dqlc), watched like the agents
    tools_dir: Path = Path("tools")
    tools_watch: bool | None = None  # default: same as agents_watch
    tool_timeout_s: float = 30.0  # a backend tool call without its own timeoutMs
    frontend_wait_timeout_s: float = 300.0  # a frontend tool waits this long for Submit
    submit_payload_limit_bytes: int = 256 * 1024
    # The _bash_ tool: a command runs in a sandbox, in its chat's workspace
    # ({bash_working_dir}/chats/{chatId}), seeing only it and the allowed paths (list as
    # JSON, or separated by commas; they may not overlap the workspaces)
    bash_working_dir: Path = Path("workspace")
    bash_allowed_paths: Annotated[list[Path], NoDecode] = Field(default_factory=list)
    bash_timeout_s: float = 10.0
    bash_output_limit_bytes: int = 64 * 1024
    bash_memory_limit_bytes: int = 512 * 1024 * 1024
    bash_max_processes: int = 64
    bash_network: bool = False
    bash_workspace_quota_bytes: int = Field(default=256 * 1024 * 1024, gt=0)  # per chat
    bash_max_concurrent: int = Field(default=4, ge=1)  # sandboxes at once; others wait
    # MCP servers whose tools are offered as backend tools (JSON list in AGW_MCP_SERVERS);
    # an agent names them in toolConfig.mcp. Unset: the example server (EXAMPLE_MCP_SERVER),
    # when there is one. `.backend` entries with a toolApi URL are HTTP tools, called by the
    # service.
    mcp_servers: list[McpServerSettings] | None = None

    # Providers; when none is configured the built-in demo provider serves every agent.
    providers: dict[str, ProviderSettings] = Field(default_factory=dict)
    default_provider: str = ""  # a provider key, or a model alias
    demo_delay_ms: float = 20.0
    # Model aliases and their deployments (README "Model aliases"): agents name an alias
    # as their model; its calls fall back, balance and keep to rate limits over them.
    deployments: dict[str, DeploymentSettings] = Field(default_factory=dict)
    aliases: dict[str, AliasSettings] = Field(default_factory=dict)

    # Chats, runs and uploads (under data_dir unless set one by one).
    data_dir: Path = Path("var")
    chats_dir: Path | None = None  # default: {data_dir}/chats
    runs_dir: Path | None = None  # default: {data_dir}/runs (event logs of ended runs)
    uploads_dir: Path | None = None  # default: {data_dir}/uploads
    chat_fsync: Literal["run", "always", "never"] = "run"
    # State backends by name (service/state/__init__.py): where chats, ended runs' event
    # logs and live runs are kept.
    chat_store: Literal["jsonl", "memory", "postgres"] = "jsonl"
    run_log: Literal["files", "memory", "postgres"] = "files"
    postgres_dsn: SecretStr = SecretStr("")  # for the `postgres` backends: postgresql://...
    postgres_timeout_s: float = Field(default=10.0, gt=0)  # one call, connecting included
    run_bus: Literal["local", "redis"] = "local"
    # Where the runs in flight are journaled, so that they outlive their process
    # (service/core/run/journal.py): `files` (a SQLite file in runs_dir), `memory`, or
    # `none` (a run ends with its process); unset: `files` with the local run bus, else
    # `none`. A run resumed this often and lost again ends with run.error OWNER_LOST.
    run_journal: Literal["files", "memory", "postgres", "none"] | None = None
    resume_attempts: int = Field(default=3, ge=1)
    # A journaled run that does nothing but wait for answers this long is parked: no task,
    # woken by an answer, its deadline or a cancel (0: never parked).
    park_after_s: float = Field(default=30.0, ge=0)
    # Where uploads (description and bytes) are kept; unset: `postgres` when chat_store is
    # `postgres` (replicas share them), else `files` under uploads_dir.
    upload_store: Literal["files", "memory", "postgres"] | None = None
    # Webhooks (README "Background runs and webhooks"): the URLs told of every run's end,
    # the service's signing key, the hosts a client's webhook URL may name ("*": any), how
    # a notification is retried, and where the queue is kept (default: as the chat store).
    webhook_urls: list[str] = Field(default_factory=list)
    webhook_secret: SecretStr = SecretStr("")
    webhook_allowed_hosts: list[str] = Field(default_factory=list)
    webhook_max_attempts: int = Field(default=10, ge=1)
    webhook_retry_s: float = Field(default=1.0, gt=0)
    webhook_retry_max_s: float = Field(default=600.0, gt=0)
    webhook_timeout_s: float = Field(default=10.0, gt=0)
    webhook_store: Literal["files", "memory", "postgres"] | None = None
    # The Redis run bus (run_bus = "redis"; docs/scale-out.md, "Redis run bus"): the server, this
    # replica's id (default hostname-pid-random), how long a silent replica keeps its runs,
    # how long an ended run's stream is kept and how long it may grow, and how long a
    # Submit or Cancel forwarded to the replica executing the run waits for its answer.
    redis_url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")
    replica_id: str = ""
    redis_lease_ttl_s: float = Field(default=10.0, gt=0)
    redis_stream_ttl_s: float = Field(default=600.0, gt=0)
    redis_stream_maxlen: int = Field(default=100_000, gt=0)
    redis_reply_timeout_s: float = Field(default=5.0, gt=0)
    memory_runs: int = 20  # the last k runs of a chat are given to the model
    context_max_tokens: int = 100_000  # and of those, the newest turns within this estimate
    # A model's context length (tokens) when neither its agent (modelConfig.contextLength)
    # nor the table of known models (service/core/run/window.py) gives one.
    context_length: int = Field(32_768, gt=0)
    multitask_strategy: Literal["reject", "enqueue", "interrupt"] = "reject"
    disconnect_policy: Literal["continue", "cancel"] = "continue"
    unwatched_run_ttl_s: float = 120.0  # a run nobody follows is cancelled after this long
    run_retention_s: float = 60.0  # ended runs stay in memory for re-attach this long
    run_archive_ttl_s: float = 7 * 24 * 3600.0  # then their event logs are kept on disk
    upload_max_bytes: int = 10 * 1024 * 1024
    # Quotas (README "Quotas and spend"): limits by tenant ("*": any tenant not named), as
    # JSON in AGW_TENANT_QUOTAS; an API key's own are its `quota`. Counted in Redis when the
    # run bus is (replicas share them), else in process. The spend ledger is kept in
    # `spend_ledger`: unset, `postgres` when chat_store is `postgres`, else `files`.
    tenant_quotas: dict[str, QuotaSettings] = Field(default_factory=dict)
    quota_slot_ttl_s: float = Field(default=60.0, gt=0)
    spend_ledger: Literal["files", "memory", "postgres"] | None = None
    # Chats unchanged this long are deleted with everything of them (0: kept for ever), by
    # a sweep every `chat_sweep_interval_s` (README "Chat lifecycle").
    chat_ttl_s: float = Field(default=0.0, ge=0)
    chat_sweep_interval_s: float = Field(default=3600.0, gt=0)
    upload_inline_text_bytes: int = 32 * 1024  # text files up to this size reach the model
    # The largest file of a chat's workspace DownloadFile reads (bigger ones: PAYLOAD_TOO_LARGE).
    download_max_bytes: int = Field(default=64 * 1024 * 1024, gt=0)

    # Interaction log of every model call (logged at DEBUG under "agw.llm").
    interaction_log_enabled: bool = True
    interaction_log_mask_sensitive: bool = True

    # Observability
    middlewares: list[str] = Field(default_factory=list)  # "module:factory" paths, in order
    debug_level: Literal["off", "basic", "standard", "full"] = "off"  # unless a query asks
    otel_traces_exporter: Literal["none", "console", "otlp"] = "none"
    otel_metrics_exporter: Literal["none", "console", "otlp"] = "none"
    otel_endpoint: str = ""  # OTLP gRPC endpoint; default: OTEL_EXPORTER_OTLP_ENDPOINT
    otel_service_name: str = "agw"
    otel_metrics_interval_s: float = 60.0
    prices: dict[str, ModelPrice] = Field(default_factory=dict)  # model name -> price
    currency: str = "USD"

    # Logging
    log_level: str = "INFO"
    log_format: Literal["text", "json"] = "text"

    @field_validator("bash_allowed_paths", mode="before")
    @classmethod
    def _path_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator("workers", mode="before")
    @classmethod
    def _auto_workers(cls, value: Any) -> Any:
        return 0 if isinstance(value, str) and value.strip().lower() == "auto" else value

    @property
    def worker_count(self) -> int:
        """How many worker processes to run: `workers`, or one per CPU for 0 ("auto")."""
        return self.workers or os.cpu_count() or 1

    @model_validator(mode="after")
    def _routing(self) -> Settings:
        """Deployments name configured providers and keys; aliases, configured deployments."""
        for name, deployment in self.deployments.items():
            provider = self.providers.get(deployment.provider)
            if provider is None:
                raise ValueError(
                    f"deployment {name!r}: provider {deployment.provider!r} is not configured"
                )
            if deployment.key and deployment.key not in provider.keys:
                raise ValueError(
                    f"deployment {name!r}: provider {deployment.provider!r} has no key "
                    f"{deployment.key!r}"
                )
        for name, alias in self.aliases.items():
            if name in self.providers:
                raise ValueError(f"alias {name!r}: a provider has this name")
            missing = [d for d in alias.deployments if d not in self.deployments]
            if missing:
                raise ValueError(f"alias {name!r}: unknown deployments {', '.join(missing)}")
        return self

    @field_validator("mcp_servers")
    @classmethod
    def _unique_servers(
        cls, value: list[McpServerSettings] | None
    ) -> list[McpServerSettings] | None:
        names = [server.name for server in value or ()]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"MCP server names must be unique: {', '.join(twice)}")
        return value

    @property
    def mcp_server_list(self) -> list[McpServerSettings]:
        """The MCP servers to connect: those set, else the example server when it is there
        (run by this interpreter, which has the MCP SDK)."""
        if self.mcp_servers is not None:
            return self.mcp_servers
        if not EXAMPLE_MCP_SERVER.is_file():
            return []
        example = McpServerSettings(
            name="clock", command=sys.executable, args=[str(EXAMPLE_MCP_SERVER)], timeout_s=10
        )
        return [example]

    @property
    def chats_path(self) -> Path:
        return self.chats_dir or self.data_dir / "chats"

    @property
    def runs_path(self) -> Path:
        return self.runs_dir or self.data_dir / "runs"

    @property
    def uploads_path(self) -> Path:
        return self.uploads_dir or self.data_dir / "uploads"

    @property
    def run_journal_name(self) -> str:
        """The run journal in use: the one set, else `files` for a single process, and
        `postgres` for replicas (the Redis run bus) sharing a PostgreSQL database."""
        if self.run_journal is not None:
            return self.run_journal
        if self.run_bus == "local":
            return "files"
        return "postgres" if self.postgres_dsn.get_secret_value() else "none"

    @property
    def spend_ledger_name(self) -> str:
        """The spend ledger in use: the one set, else the one the chat store implies."""
        if self.spend_ledger is not None:
            return self.spend_ledger
        return "postgres" if self.chat_store == "postgres" else "files"

    @property
    def upload_store_name(self) -> str:
        """The upload store in use: the one set, else the one the chat store implies."""
        if self.upload_store is not None:
            return self.upload_store
        return "postgres" if self.chat_store == "postgres" else "files"

    @property
    def webhook_store_name(self) -> str:
        """The webhook store in use: the one set, else the one the chat store implies."""
        if self.webhook_store is not None:
            return self.webhook_store
        return {"postgres": "postgres", "memory": "memory"}.get(self.chat_store, "files")

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


def load_settings() -> Settings:
    """The settings of the environment and the TOML file; `SettingsProblem` (one line
    naming the setting) when they cannot be read."""
    try:
        return Settings()
    except SettingsError as error:  # a value that is not the JSON its setting takes
        field = re.search(r'field "(\w+)"', str(error))
        raise SettingsProblem(_unreadable(field.group(1) if field else "")) from None
    except ValidationError as error:
        problems = "; ".join(_problem(e["loc"], e["msg"]) for e in error.errors())
        raise SettingsProblem(problems) from None


def _problem(loc: tuple[int | str, ...], message: str) -> str:
    """What is wrong with the setting at `loc`: its environment variable (and the path
    inside its value), and why."""
    if len(loc) == 1:
        raw = os.environ.get(f"AGW_{str(loc[0]).upper()}")
        if raw is not None and _not_json(raw):
            return _unreadable(str(loc[0]))
    name = f"AGW_{str(loc[0]).upper()}" if loc else "settings"
    path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc[1:])
    return f"{name}{path}: {message}"


def _unreadable(field: str) -> str:
    name = f"AGW_{field.upper()}" if field else "a setting"
    raw = os.environ.get(name, "")
    if not raw.strip():
        return f"{name} is set but empty: give it a JSON value (e.g. [] for none) or unset it"
    return f"{name} is not valid JSON ({raw[:40]!r}): correct it or unset it"


def _not_json(raw: str) -> bool:
    try:
        json.loads(raw)
    except ValueError:
        return raw.strip()[:1] in ("", "[", "{")  # meant as JSON (a list or an object), or empty
    return False
