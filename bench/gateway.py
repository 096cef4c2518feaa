"""The gateway under test: the real `App`, one ONESHOT agent, the fake provider as its provider."""

from __future__ import annotations

from pathlib import Path

from bench.protocol import AGENT_KEY, HOST, MODEL
from service.app import App
from service.config import ProviderSettings, Settings
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
    )


async def start_gateway(provider_url: str, workdir: Path, max_streams: int) -> App:
    app = App(gateway_settings(provider_url, workdir, max_streams))
    await app.start()
    return app
