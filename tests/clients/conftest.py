from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from service.providers.loopback import LoopbackProvider
from service.testing import Harness, oneshot_agent, write_agent

PICK_TOOL = {
    "name": "pick",
    "description": "Let the user pick a color and wait for the choice.",
    "parameters": {"type": "object", "properties": {"question": {"type": "string"}}},
}
THEME_ACTION = {
    "name": "switch_theme",
    "description": "Switch the page's theme.",
    "parameters": {"type": "object", "properties": {"theme": {"type": "string"}}},
}


@pytest.fixture
async def frontend_gateway(tmp_path: Path, provider: LoopbackProvider) -> AsyncIterator[Harness]:
    """A gateway whose agent "picker" has the frontend tool "pick" (an .html tool) and the
    action "switch_theme"."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "pick.html").write_text(json.dumps({"tools": [PICK_TOOL]}))
    (tools / "ui.action").write_text(json.dumps({"tools": [THEME_ACTION]}))
    agents = tmp_path / "agents"
    write_agent(
        agents,
        "picker",
        oneshot_agent(toolConfig={"frontends": ["pick"], "actions": ["switch_theme"]}),
    )
    async with Harness.start(agents, provider, tools_dir=tools, tools_watch=False) as harness:
        yield harness


async def start_agw(target: str, *args: str) -> asyncio.subprocess.Process:
    """The `agw` command against `target`, without colours, its output piped."""
    return await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "agw_client", *args, "--target", target),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "NO_COLOR": "1"},
    )
