"""The gateway under test: the real `App`, one ONESHOT agent, the fake provider as its provider.

Its variants (`GATEWAYS`): "gateway" as configured by default (no exporter,
the OpenTelemetry API a no-op), "gateway+otel" with the SDK installed and
"gateway-no-otel" (and "-2", a second process) without instrumentation (see
bench/otel.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import otel
from bench.protocol import AGENT_KEY, GATEWAYS, HOST, MODEL
from service.assembly.app import App
from service.assembly.config import ProviderSettings, Settings
from service.testing import oneshot_agent, write_agent

PROVIDER_KEY = "bench"


def gateway_settings(provider_url: str, workdir: Path, max_streams: int) -> Settings:
    """Production defaults, except as listed here.

    Loopback gRPC port, no HTTP adapter, no file watching, every file under
    `workdir`, room for every stream, and `disconnect_policy="cancel"`: a
    stream the client closes (the idle ones) ends its run and its upstream
    request at once instead of playing on. None of these is on the per-delta path.
    """
    agents = workdir / "agents"
    (workdir / "tools").mkdir(parents=True, exist_ok=True)
    write_agent(agents, AGENT_KEY, oneshot_agent("You are a benchmark."))
    provider = ProviderSettings(
        base_url=provider_url,
        default_model=MODEL,
        max_retries=0,
        max_connections=max_streams,
    )
    return Settings(
        grpc_address=f"{HOST}:0",
        agents_dir=agents,
        agents_watch=False,
        tools_dir=workdir / "tools",
        tools_watch=False,
        bash_working_dir=workdir / "workspace",
        data_dir=workdir / "data",
        http_enabled=False,
        disconnect_policy="cancel",
        providers={PROVIDER_KEY: provider},
        default_provider=PROVIDER_KEY,
        max_concurrent_runs=max_streams,
        shutdown_grace_s=2.0,
        mcp_servers=[],  # not the example MCP server `make run` starts
    )


@dataclass
class Gateway:
    """A started gateway; the SDK it installed, or how many names lost their instrumentation."""

    app: App
    sdk: otel.Sdk | None = None
    removed: int = 0

    @property
    def port(self) -> int:
        return self.app.grpc.port

    def counters(self) -> dict[str, Any]:
        """What its telemetry did: spans and metric collections exported, names replaced."""
        counters: dict[str, Any] = {"otel_names_removed": self.removed}
        if self.sdk is not None:
            counters.update(self.sdk.counters())
        return counters

    def flush(self) -> None:
        if self.sdk is not None:
            self.sdk.flush()

    async def stop(self) -> None:
        try:
            await self.app.stop()
        finally:
            if self.sdk is not None:
                self.sdk.telemetry.shutdown()


async def start_gateway(
    provider_url: str, workdir: Path, max_streams: int, kind: str = "gateway"
) -> Gateway:
    """Start the gateway variant `kind` (one of `GATEWAYS`)."""
    if kind not in GATEWAYS:
        raise ValueError(f"not a gateway variant: {kind!r}")
    settings = gateway_settings(provider_url, workdir, max_streams)
    installed = None
    if kind == otel.WITH_SDK:
        settings = otel.with_sdk(settings)
        installed = otel.install_sdk(settings)
    gateway = Gateway(App(settings), installed)
    await gateway.app.start()
    if kind in (otel.WITHOUT_INSTRUMENTATION, otel.WITHOUT_INSTRUMENTATION_AGAIN):
        gateway.removed = otel.remove_instrumentation()
    return gateway
