"""The adapter as its own process (`python -m service.gateway`), and the in-process wiring."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import httpx
import httpx_sse
import orjson
import pytest

from service.gateway import local_target
from service.providers.loopback import DONE, LoopbackProvider, content, finish
from service.testing import Harness

ROOT = Path(__file__).resolve().parents[2]


async def test_the_adapter_runs_as_its_own_process(
    agents_dir: Path, provider: LoopbackProvider
) -> None:
    async with Harness.start(agents_dir, provider, http_enabled=False) as service:
        assert service.app.http is None
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "service.gateway",
            "--grpc-target",
            f"127.0.0.1:{service.app.grpc.port}",
            "--address",
            "127.0.0.1:0",
            "--allowed-host",
            "app.example",
            "--allowed-host",
            ".corp.example",
            cwd=ROOT,
            env={**os.environ, "AGW_LOG_LEVEL": "INFO", "AGW_LOG_FORMAT": "text"},
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert process.stderr is not None
            port = 0
            while not port:
                line = (await asyncio.wait_for(process.stderr.readline(), 30)).decode()
                assert line, "the adapter exited before listening"
                if found := re.search(r"HTTP listening on .* \(port (\d+)\)", line):
                    port = int(found.group(1))
            provider.enqueue([content("from afar"), finish("stop"), DONE])
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                agents = (await http.get("/api/agents")).json()["data"]["agents"]
                assert [a["key"] for a in agents] == ["plain", "thinker"]
                hosts = ["app.example:8080", "x.corp.example", "localhost", "evil.example"]
                served = [(await http.get("/", headers={"Host": h})).status_code for h in hosts]
                assert served == [200, 200, 421, 421]  # the flag's list and the bound host
                body = {"agentKey": "plain", "message": "hi"}
                async with httpx_sse.aconnect_sse(http, "POST", "/api/query", json=body) as source:
                    types = [orjson.loads(sse.data)["type"] async for sse in source.aiter_sse()]
            assert types[-3:] == ["content.delta", "content.end", "run.complete"]
        finally:
            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), 30) == 0


async def test_the_service_serves_http_next_to_grpc(gateway: Harness) -> None:
    assert gateway.app.http is not None
    assert gateway.app.http.grpc_target == f"127.0.0.1:{gateway.app.grpc.port}"
    async with httpx.AsyncClient(base_url=gateway.http_url) as http:
        page = await http.get("/")
        script = await http.get("/static/app.js")
    assert page.status_code == 200 and "<title>agw" in page.text
    assert page.headers["Content-Type"].startswith("text/html")
    assert script.status_code == 200 and "javascript" in script.headers["Content-Type"]


@pytest.mark.parametrize(
    ("address", "target"),
    [
        ("127.0.0.1:50051", "127.0.0.1:7"),
        ("0.0.0.0:50051", "127.0.0.1:7"),
        ("[::]:50051", "127.0.0.1:7"),
        ("10.1.2.3:0", "10.1.2.3:7"),
        ("[::1]:0", "[::1]:7"),
    ],
)
def test_local_target(address: str, target: str) -> None:
    assert local_target(address, 7) == target
