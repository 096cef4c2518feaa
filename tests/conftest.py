from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from service.providers.loopback import LoopbackProvider
from service.testing import Harness, oneshot_agent, write_agent
from tests.servers import postgres_dsn, postgres_server, redis_server, redis_url  # noqa: F401


@pytest.fixture
async def provider() -> AsyncIterator[LoopbackProvider]:
    async with LoopbackProvider() as fake:
        yield fake


@pytest.fixture
def agents_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "agents"
    write_agent(directory, "plain", oneshot_agent("You are terse."))
    write_agent(
        directory,
        "thinker",
        oneshot_agent("Think first.", modelConfig={"reasoning": {"enabled": True}}),
    )
    return directory


@pytest.fixture
async def gateway(agents_dir: Path, provider: LoopbackProvider) -> AsyncIterator[Harness]:
    async with Harness.start(agents_dir, provider) as harness:
        yield harness


@pytest.fixture
async def cancelling_gateway(
    agents_dir: Path, provider: LoopbackProvider
) -> AsyncIterator[Harness]:
    """A gateway whose disconnect policy is to cancel the run."""
    async with Harness.start(agents_dir, provider, disconnect_policy="cancel") as harness:
        yield harness
