"""The Node client, run by `node --test` against the real service started here."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from service.providers.loopback import DONE, Gate, HttpError, LoopbackProvider, content, finish
from service.testing import Harness, oneshot_agent, write_agent

NODE_DIR = Path(__file__).resolve().parents[2] / "clients" / "node"


@pytest.fixture
def node() -> str:
    path = shutil.which("node")
    assert path, "Node.js is needed for the Node client's tests"
    assert (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir(), "run `make install`"
    return path


async def test_node_client_interop(node: str, tmp_path: Path, provider: LoopbackProvider) -> None:
    never = asyncio.Event()

    def respond(body: dict[str, Any]) -> list[Any]:
        said = body["messages"][-1]["content"]
        if said == "hang":
            return [content("so far"), Gate(never)]
        if said == "fail":
            return [HttpError(500, {"error": {"message": "boom"}})]
        return [content("Hel"), content("lo"), finish("stop"), DONE]

    provider.responder = respond
    agents = tmp_path / "agents"
    write_agent(agents, "plain", oneshot_agent("You are terse."))
    async with Harness.start(agents, provider) as gateway:
        process = await asyncio.create_subprocess_exec(
            node,
            "--test",
            "--test-reporter=tap",
            "test/",
            cwd=NODE_DIR,
            env={**os.environ, "AGW_TARGET": f"127.0.0.1:{gateway.app.grpc.port}"},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(process.communicate(), 60)
        never.set()
    report = out.decode()
    assert process.returncode == 0, report
    assert "# pass 8" in report and "# fail 0" in report, report
