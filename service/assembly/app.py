"""Assembly: settings → providers, agents, state, the front door, servers; start and stop."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
from typing import Any

from service import state
from service.assembly import security
from service.assembly.config import (
    AliasSettings,
    CannotStart,
    DeploymentSettings,
    McpServerSettings,
    ModelPrice,
    ProviderSettings,
    QuotaSettings,
    Settings,
)
from service.assembly.models import model_catalog
from service.builtins.bash import BashOptions, chats_dir, remove_workspace
from service.builtins.builtin import builtin_tools
from service.builtins.files import WorkspaceReader
from service.core.agents.registry import AgentRegistry
from service.core.agents.skills import SkillRegistry
from service.core.chats.uploads import Uploads
from service.core.commands import DebugLevel
from service.core.errors import AgentNotFound
from service.core.frontdoor import FrontDoor
from service.core.lifecycle import RunOptions
from service.core.middleware import load_middlewares
from service.core.model import Usage
from service.core.notifier import Notifier
from service.core.quotas import Limits, QuotaOptions, Quotas
from service.core.run.observation import Price
from service.core.run.state import Pricing
from service.core.tools.registry import ToolRegistry
from service.core.tools.skill_tool import SkillTools
from service.core.webhooks import Webhook, WebhookOptions
from service.gateway import HttpGateway, local_target
from service.notify import WebhookSender
from service.providers.demo import DEMO_KEY, DEMO_MODEL, demo_responder
from service.providers.loopback import LoopbackProvider
from service.providers.openai import OpenAIChatClient, ProviderOptions
from service.providers.registry import ProviderRegistry
from service.providers.routing.deployment import AliasOptions, DeploymentOptions
from service.providers.routing.limits import Limiter, LocalLimiter
from service.providers.routing.redis_limits import RedisLimiter
from service.toolsources.http import HttpTools
from service.toolsources.mcp import McpServer, McpServerOptions
from service.transport.server import GrpcServer

log = logging.getLogger("agw")


def price(p: ModelPrice) -> Price:
    return Price(p.input_per_million, p.output_per_million, p.cached_input_per_million)


def model_prices(settings: Settings) -> dict[str, ModelPrice]:
    """The price table: `prices`, and the price of each deployment's model it leaves out."""
    prices = dict(settings.prices)
    for deployment in settings.deployments.values():
        if deployment.price is not None:
            prices.setdefault(deployment.model, deployment.price)
    return prices


class AddressUnavailable(CannotStart):
    """An address to listen on cannot be bound: in use, or not an address of this host."""

    def __init__(self, what: str, address: str, setting: str, also: str = "") -> None:
        host, _, port = address.rpartition(":")
        other = f"{host}:{int(port) + 1}" if port.isdigit() and port != "0" else f"{host}:0"
        super().__init__(
            f"cannot listen for {what} on {address} (in use by another process, or not an "
            f"address of this host): set {setting} to another address, e.g. {other}{also}"
        )


HTTP_ALSO = " (or AGW_HTTP_ENABLED=false for no HTTP API and page)"


def check_free(address: str, what: str, setting: str, also: str = "") -> None:
    """`AddressUnavailable` unless "host:port" can be bound now (port 0 always can), so
    that a busy port is said before anything starts."""
    host, _, port = address.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, int(port)))
        except OSError:
            raise AddressUnavailable(what, address, setting, also) from None


def pricing(settings: Settings) -> Pricing:
    """The cost of a call from the configured price table (None for an unpriced model)."""
    prices = {model: price(p) for model, p in model_prices(settings).items()}

    def cost(model: str, usage: Usage) -> float | None:
        price = prices.get(model)
        return price.cost(usage) if price is not None else None

    return cost


def limits(quota: QuotaSettings) -> Limits:
    return Limits(
        concurrent_runs=quota.concurrent_runs,
        requests_per_minute=quota.requests_per_minute,
        tokens_per_day=quota.tokens_per_day,
        spend_per_month=quota.spend_per_month,
    )


def quotas(settings: Settings, options: state.StateOptions) -> Quotas:
    """The quotas of the tenants and API keys, counted in Redis when the run bus is, and the
    spend ledger."""
    keys = {
        key.name or key.subject: limits(key.quota)
        for key in settings.auth_api_keys
        if key.quota is not None
    }
    tenants = {tenant: limits(quota) for tenant, quota in settings.tenant_quotas.items()}
    counters = state.QUOTA_COUNTERS["redis" if settings.run_bus == "redis" else "local"]
    return Quotas(
        counters(options),
        state.SPEND_LEDGERS[settings.spend_ledger_name](options),
        QuotaOptions(tenants, keys, slot_ttl_s=settings.quota_slot_ttl_s),
    )


def provider_options(provider: ProviderSettings) -> ProviderOptions:
    """What the client of one configured provider reads."""
    return ProviderOptions(
        base_url=provider.base_url,
        api_key=provider.api_key,
        default_model=provider.default_model,
        api=provider.api,
        reasoning_style=provider.reasoning_style,
        max_tokens=provider.max_tokens,
        extra_body=provider.extra_body,
        headers=provider.headers,
        secret_headers=provider.secret_headers,
        connect_timeout_s=provider.connect_timeout_s,
        read_timeout_s=provider.read_timeout_s,
        max_retries=provider.max_retries,
        retry_backoff_s=provider.retry_backoff_s,
        max_retry_after_s=provider.max_retry_after_s,
        max_connections=provider.max_connections,
        max_sse_line_bytes=provider.max_sse_line_bytes,
        max_sse_event_bytes=provider.max_sse_event_bytes,
    )


def deployment_options(name: str, deployment: DeploymentSettings) -> DeploymentOptions:
    """What one configured deployment of model aliases reads."""
    return DeploymentOptions(
        name=name,
        provider=deployment.provider,
        model=deployment.model,
        key=deployment.key,
        weight=deployment.weight,
        rpm=deployment.rpm,
        tpm=deployment.tpm,
        context_length=deployment.context_length,
        price=price(deployment.price) if deployment.price is not None else None,
        max_retries=deployment.max_retries,
        cooldown_s=deployment.cooldown_s,
        max_cooldown_s=deployment.max_cooldown_s,
    )


def alias_options(name: str, alias: AliasSettings) -> AliasOptions:
    return AliasOptions(
        name=name,
        deployments=tuple(alias.deployments),
        strategy=alias.strategy,
        restart_on_failure=alias.restart_on_failure,
    )


def routing_limiter(settings: Settings) -> Limiter:
    """Where the deployments' limits are counted: in Redis when the replicas share one
    (the Redis run bus), else in this process."""
    if settings.run_bus == "redis" and settings.aliases:
        return RedisLimiter(settings.redis_url.get_secret_value())
    return LocalLimiter()


def open_providers(settings: Settings) -> ProviderRegistry:
    """The providers and model aliases of the settings."""
    return ProviderRegistry(
        {key: provider_options(p) for key, p in settings.providers.items()},
        default_provider=settings.default_provider,
        log_enabled=settings.interaction_log_enabled,
        log_mask=settings.interaction_log_mask_sensitive,
        deployments=[deployment_options(n, d) for n, d in settings.deployments.items()],
        aliases=[alias_options(n, a) for n, a in settings.aliases.items()],
        keys={key: p.keys for key, p in settings.providers.items() if p.keys},
        limiter=routing_limiter(settings),
    )


def bash_options(settings: Settings) -> BashOptions:
    """The `_bash_` tool's options, from the `bash_*` settings."""
    return BashOptions(
        working_dir=settings.bash_working_dir,
        allowed_paths=tuple(settings.bash_allowed_paths),
        timeout_s=settings.bash_timeout_s,
        output_limit_bytes=settings.bash_output_limit_bytes,
        memory_limit_bytes=settings.bash_memory_limit_bytes,
        max_processes=settings.bash_max_processes,
        network=settings.bash_network,
        workspace_quota_bytes=settings.bash_workspace_quota_bytes,
        max_concurrent=settings.bash_max_concurrent,
    )


def mcp_options(server: McpServerSettings) -> McpServerOptions:
    """What one configured MCP server's source reads."""
    return McpServerOptions(
        name=server.name,
        transport=server.transport,
        command=server.command,
        args=tuple(server.args),
        env=server.env,
        cwd=server.cwd,
        url=server.url,
        headers=server.headers,
        timeout_s=server.timeout_s,
        tool_prefix=server.tool_prefix,
        title=server.title,
        icon=server.icon,
        connect_timeout_s=server.connect_timeout_s,
        max_output_bytes=server.max_output_bytes,
        ping_interval_s=server.ping_interval_s,
        reconnect_min_s=server.reconnect_min_s,
        reconnect_max_s=server.reconnect_max_s,
    )


class App:
    """The whole service, started and stopped as one."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.providers = open_providers(settings)
        self.agents = AgentRegistry(settings.agents_dir)
        self.mcp = [McpServer(mcp_options(s), environ=os.environ) for s in settings.mcp_server_list]
        self.skills = SkillRegistry(settings.skills_dir)
        self.tools = ToolRegistry(
            settings.tools_dir,
            builtin=builtin_tools(bash_options(settings), settings.frontend_wait_timeout_s),
            sources=[*self.mcp, SkillTools(self.skills, self.agents)],
            default_timeout_s=settings.tool_timeout_s,
        )
        self.http_tools: HttpTools | None = None
        if self.tools.files is not None:
            self.http_tools = HttpTools(self.tools.files, environ=os.environ)
            self.tools.add_source(self.http_tools)
        options = state.StateOptions(
            chats_dir=settings.chats_path,
            runs_dir=settings.runs_path,
            chat_fsync=settings.chat_fsync,
            run_log_ttl_s=settings.run_archive_ttl_s,
            wait_timeout_s=settings.frontend_wait_timeout_s,
            submit_payload_limit_bytes=settings.submit_payload_limit_bytes,
            postgres_dsn=settings.postgres_dsn.get_secret_value(),
            postgres_timeout_s=settings.postgres_timeout_s,
            uploads_dir=settings.uploads_path,
            redis_url=settings.redis_url.get_secret_value(),
            replica_id=settings.replica_id,
            lease_ttl_s=settings.redis_lease_ttl_s,
            stream_ttl_s=settings.redis_stream_ttl_s,
            stream_maxlen=settings.redis_stream_maxlen,
            reply_timeout_s=settings.redis_reply_timeout_s,
        )
        self.chats = state.CHAT_STORES[settings.chat_store](options)
        self.bus = state.RUN_BUSES[settings.run_bus](options)
        self.webhooks = state.WEBHOOK_STORES[settings.webhook_store_name](options)
        secret = settings.webhook_secret.get_secret_value()
        self.webhook_sender = WebhookSender(
            self.webhooks,
            secret=secret,
            max_attempts=settings.webhook_max_attempts,
            retry_s=settings.webhook_retry_s,
            retry_max_s=settings.webhook_retry_max_s,
            timeout_s=settings.webhook_timeout_s,
        )
        self.notifier = Notifier(
            self.webhooks,
            service_webhooks=[Webhook(url) for url in settings.webhook_urls],
            agent_webhooks=self._agent_webhooks,
            wake=self.webhook_sender.wake,
        )
        self.frontdoor = FrontDoor(
            self.agents,
            self.providers,
            chats=self.chats,
            run_log=state.RUN_LOGS[settings.run_log](options),
            bus=self.bus,
            uploads=Uploads(
                state.UPLOAD_STORES[settings.upload_store_name](options),
                settings.upload_max_bytes,
            ),
            tools=self.tools,
            skills=self.skills,
            options=RunOptions(
                max_active_runs=settings.max_concurrent_runs,
                max_message_bytes=settings.max_message_bytes,
                memory_runs=settings.memory_runs,
                context_max_tokens=settings.context_max_tokens,
                context_length=settings.context_length,
                multitask_strategy=settings.multitask_strategy,
                unwatched_run_ttl_s=settings.unwatched_run_ttl_s,
                retention_s=settings.run_retention_s,
                image_input=self._image_input,
                inline_text_bytes=settings.upload_inline_text_bytes,
                middlewares=(*load_middlewares(settings.middlewares, settings), self.notifier),
                debug_level=DebugLevel[settings.debug_level.upper()],
                pricing=pricing(settings) if model_prices(settings) else None,
                currency=settings.currency,
                resume_attempts=settings.resume_attempts,
                park_after_s=settings.park_after_s,
                replica=settings.replica_id or settings.worker_name or _process_name(),
            ),
            journal=state.RUN_JOURNALS[settings.run_journal_name](options),
            chat_cleaners=[functools.partial(remove_workspace, settings.bash_working_dir)],
            quotas=quotas(settings, options),
            agent_store=state.AGENT_STORES[settings.agent_store](options),
            agent_store_poll_s=settings.agent_store_poll_s,
            files=WorkspaceReader(chats_dir(bash_options(settings))),
            download_max_bytes=settings.download_max_bytes,
            webhooks=self.webhooks,
            webhook_options=WebhookOptions(tuple(settings.webhook_allowed_hosts), bool(secret)),
        )
        self.authenticator = security.authenticator(settings)
        security.check_exposure(settings, self.authenticator)
        self.tls = security.tls_material(settings)
        if not settings.reuse_port:  # a worker shares its ports with the others
            check_free(settings.grpc_address, "gRPC", "AGW_GRPC_ADDRESS")
            if settings.http_enabled:
                check_free(settings.http_address, "HTTP", "AGW_HTTP_ADDRESS", HTTP_ALSO)
        try:
            self.grpc = GrpcServer(
                self.frontdoor,
                settings.grpc_address,
                keepalive_time_s=settings.keepalive_time_s,
                cancel_on_disconnect=settings.disconnect_policy == "cancel",
                authenticator=self.authenticator,
                max_concurrent_rpcs=(
                    settings.max_concurrent_rpcs or settings.max_concurrent_runs + 256
                ),
                tls=self.tls,
                heartbeat_s=settings.grpc_heartbeat_s,
                reuse_port=settings.reuse_port,
                models=model_catalog(self.providers),
            )
        except (OSError, RuntimeError) as error:  # grpc says RuntimeError("Failed to bind ...")
            if isinstance(error, RuntimeError) and "bind" not in str(error):
                raise
            raise AddressUnavailable("gRPC", settings.grpc_address, "AGW_GRPC_ADDRESS") from None
        self.demo: LoopbackProvider | None = None
        self.http: HttpGateway | None = None
        self._stop_watch = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None
        self._tools_watch: asyncio.Task[None] | None = None
        self._skills_watch: asyncio.Task[None] | None = None
        self._sweep: asyncio.Task[None] | None = None

    def _agent_webhooks(self, agent_key: str) -> list[Webhook]:
        """The webhooks an agent's file names (the agent as it is loaded now)."""
        try:
            agent = self.agents.get(agent_key)
        except AgentNotFound:
            return []
        return [Webhook(url) for url in agent.webhooks]

    def _image_input(self, provider: str) -> bool:
        """Whether a call of `provider` (a provider key or an alias) may carry images: an
        alias's when every one of its deployments' providers accepts them."""
        settings = self.settings
        configured = settings.providers.get(provider)
        if configured is not None:
            return configured.image_input
        alias = settings.aliases.get(provider)
        if alias is not None:
            return all(
                settings.providers[settings.deployments[name].provider].image_input
                for name in alias.deployments
            )
        return provider == DEMO_KEY

    async def start(self) -> None:
        await self.frontdoor.open()
        if not self.settings.providers:
            await self._start_demo_provider()
        self.agents.load_all()
        log.info(
            "loaded %d agents from %s (%d broken)",
            len(self.agents.list()),
            self.settings.agents_dir,
            len(self.agents.errors),
        )
        if self.settings.agent_store_seed:
            await self.frontdoor.catalog.seed()
        self.skills.load_all()
        log.info(
            "loaded %d skills from %s (%d broken)",
            len(self.skills.list()),
            self.settings.skills_dir,
            len(self.skills.errors),
        )
        if self.settings.agents_watch:
            self._watch = asyncio.create_task(self.agents.watch(self._stop_watch))
            self._skills_watch = asyncio.create_task(self.skills.watch(self._stop_watch))
        self.tools.load_all()
        await asyncio.gather(*(server.start() for server in self.mcp))
        log.info(
            "loaded %d tools (%d broken files)", len(self.tools.list()), len(self.tools.errors)
        )
        tools_watch = self.settings.tools_watch
        if tools_watch if tools_watch is not None else self.settings.agents_watch:
            self._tools_watch = asyncio.create_task(self.tools.watch(self._stop_watch))
        await self.webhook_sender.start()  # what the last process left queued goes out too
        if self.settings.run_bus == "local":  # the runs the last process left go on here
            resumed = await self.frontdoor.resume("restart")
            if resumed:
                log.info("resumed %d runs left by the last process", len(resumed))
        await self.grpc.start()
        if self.settings.http_enabled:
            await self._start_http()
        if self.settings.chat_ttl_s:
            self._sweep = asyncio.create_task(self._sweep_chats(), name="chat-sweep")

    async def _sweep_chats(self) -> None:
        """Delete the chats unchanged for `chat_ttl_s`, now and every sweep interval."""
        settings = self.settings
        while True:
            try:
                await self.frontdoor.expire_chats(settings.chat_ttl_s)
            except Exception:
                log.exception("the sweep of expired chats failed; trying again later")
            await asyncio.sleep(settings.chat_sweep_interval_s)

    async def _start_http(self) -> None:
        """The HTTP/SSE adapter and web page, calling this process's gRPC server by default."""
        settings = self.settings
        tls: dict[str, Any] = {}
        if self.tls is not None:
            tls["ssl_context"] = security.server_ssl_context(*self.tls)
            if not settings.http_grpc_target:  # our own gRPC server speaks TLS too
                credentials, options = security.local_channel_security(self.tls[0])
                tls.update(grpc_credentials=credentials, grpc_options=options)
        self.http = HttpGateway(
            settings.http_grpc_target
            or self.grpc.own_target
            or local_target(settings.grpc_address, self.grpc.port),
            heartbeat_s=settings.http_heartbeat_s,
            write_timeout_s=settings.http_write_timeout_s,
            max_body_bytes=settings.http_max_body_bytes,
            cors_origins=settings.http_cors_origins,
            allowed_hosts=settings.http_allowed_hosts,
            **tls,
        )
        try:
            await self.http.start(settings.http_address, reuse_port=settings.reuse_port)
        except OSError:
            address = settings.http_address
            raise AddressUnavailable("HTTP", address, "AGW_HTTP_ADDRESS", HTTP_ALSO) from None

    async def _start_demo_provider(self) -> None:
        self.demo = LoopbackProvider(demo_responder(self.settings.demo_delay_ms / 1000))
        await self.demo.start()
        demo = ProviderOptions(
            base_url=self.demo.url, default_model=DEMO_MODEL, reasoning_style="enable_thinking"
        )
        self.providers.register(DEMO_KEY, OpenAIChatClient(DEMO_KEY, demo))
        log.info("no provider configured: serving agents with the built-in demo model")

    async def stop(self) -> None:
        """Drain runs within the grace period, then close everything."""
        if self._sweep is not None:  # before the stores it deletes from are closed
            self._sweep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweep
        await self.grpc.stop(self.settings.shutdown_grace_s, self.settings.drain_delay_s)
        await self.notifier.flush()  # the runs' last notices are queued (and kept)
        await self.webhook_sender.stop()
        await self.frontdoor.close()
        if self.http is not None:  # after the drain, so SSE streams got their terminal events
            await self.http.stop()
        self._stop_watch.set()
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        for watch in (self._tools_watch, self._skills_watch):
            if watch is not None:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
        await asyncio.gather(*(server.stop() for server in self.mcp))
        if self.http_tools is not None:
            await self.http_tools.aclose()
        await self.providers.aclose()
        if self.demo is not None:
            await self.demo.stop()
        await self.frontdoor.lifecycle.chats.close()
        await self.frontdoor.lifecycle.run_log.close()
        await self.frontdoor.lifecycle.uploads.close()


def _process_name() -> str:
    """This process, as `run.resume` names the replica that resumed a run."""
    return f"{socket.gethostname()}-{os.getpid()}"
