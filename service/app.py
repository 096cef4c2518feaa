"""Assembly: settings → providers, agents, runtime, gRPC server; start and stop in order."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from service.config import ProviderSettings, Settings
from service.core.agent_registry import AgentRegistry
from service.core.runtime import Runtime
from service.providers.demo import DEMO_KEY, DEMO_MODEL, demo_responder
from service.providers.loopback import LoopbackProvider
from service.providers.openai import OpenAIChatClient
from service.providers.registry import ProviderRegistry
from service.transport.server import GrpcServer

log = logging.getLogger("agw")


class App:
    """The whole service, started and stopped as one."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.providers = ProviderRegistry(settings)
        self.agents = AgentRegistry(settings.agents_dir)
        self.runtime = Runtime(
            self.agents, self.providers, max_active_runs=settings.max_concurrent_runs
        )
        self.grpc = GrpcServer(
            self.runtime, settings.grpc_address, keepalive_time_s=settings.keepalive_time_s
        )
        self.demo: LoopbackProvider | None = None
        self._stop_watch = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if not self.settings.providers:
            await self._start_demo_provider()
        self.agents.load_all()
        log.info(
            "loaded %d agents from %s (%d broken)",
            len(self.agents.list()),
            self.settings.agents_dir,
            len(self.agents.errors),
        )
        if self.settings.agents_watch:
            self._watch = asyncio.create_task(self.agents.watch(self._stop_watch))
        await self.grpc.start()

    async def _start_demo_provider(self) -> None:
        self.demo = LoopbackProvider(demo_responder(self.settings.demo_delay_ms / 1000))
        await self.demo.start()
        demo = ProviderSettings(
            base_url=self.demo.url, default_model=DEMO_MODEL, reasoning_style="enable_thinking"
        )
        self.providers.register(DEMO_KEY, OpenAIChatClient(DEMO_KEY, demo))
        log.info("no provider configured: serving agents with the built-in demo model")

    async def stop(self) -> None:
        """Drain runs within the grace period, then close everything."""
        await self.grpc.stop(self.settings.shutdown_grace_s)
        self._stop_watch.set()
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self.providers.aclose()
        if self.demo is not None:
            await self.demo.stop()
