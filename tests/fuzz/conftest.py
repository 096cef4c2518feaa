"""The fuzzed service: one per test module (settings from the module's `SERVICE_SETTINGS`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.fuzz.kit import FuzzService, fuzz_service


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[FuzzService]:
    settings = getattr(request.module, "SERVICE_SETTINGS", {})
    async with fuzz_service(tmp_path_factory.mktemp("fuzz"), **settings) as running:
        yield running
    running.guard.check()
