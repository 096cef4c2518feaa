"""HTTP-backed `.backend` tools in real queries: an aiohttp endpoint on loopback, the service.

The tool files declare the tools (`toolApi`, `toolParams`); the model (a loopback
provider) calls them; results, failures and limits come back as `tool.result`s,
and no resolved secret reaches an event, a result or a log line.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from service.providers.loopback import LoopbackProvider
from service.testing import Harness, write_agent
from tests.core.tools.kit import agent, answer_turn, assert_invariants, call_turn, kinds, result_of
from tests.toolsources.kit import ANSWER, CALL, HEAD, snapshots

TOKEN = "http-5ecret-token-99"
BUDGET = {"maxModelCalls": 10, "maxToolCalls": 10, "maxSteps": 10, "timeoutMs": 60000}


class Endpoint:
    """The HTTP API the tools call, on a loopback port."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.release = asyncio.Event()  # lets a slow answer go (at the end of the test)
        app = web.Application()
        app.router.add_post("/weather", self.weather)
        app.router.add_get("/search", self.search)
        app.router.add_get("/words", self.words)
        app.router.add_post("/fail", self.fail)
        app.router.add_get("/flood", self.flood)
        app.router.add_post("/slow", self.slow)
        app.router.add_get("/moved", self.moved)
        self.runner = web.AppRunner(app)
        self.url = ""

    async def weather(self, request: web.Request) -> web.Response:
        body = await request.json()
        authorized = request.headers.get("Authorization") == f"Bearer {TOKEN}"
        self.seen.append({"key": request.query.get("key"), "authorized": authorized})
        return web.json_response({"city": body["city"], "sky": "clear", "authorized": authorized})

    async def search(self, request: web.Request) -> web.Response:
        return web.json_response({"query": [[k, v] for k, v in request.query.items()]})

    async def words(self, request: web.Request) -> web.Response:
        return web.Response(text="plain words")

    async def fail(self, request: web.Request) -> web.Response:
        sent = request.headers.get("Authorization", "")
        return web.Response(status=503, text=f"upstream down;\n you sent {sent}" + " ." * 400)

    async def flood(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(4):
            await response.write(b"y" * 500)
        await response.write_eof()
        return response

    async def slow(self, request: web.Request) -> web.Response:
        await self.release.wait()
        return web.Response(text="late")

    async def moved(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/words")

    async def start(self) -> None:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"


def tool(name: str, api: str, description: str = "", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": description or f"The {name} endpoint.",
        "parameters": {"type": "object", "properties": {}},
        "toolApi": api,
        **extra,
    }


def write_tools(directory: Path, base: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    secret = "${ENV:AGW_TEST_HTTP_TOKEN}"
    entries = [
        tool(
            "weather",
            f"{base}/weather?key={secret}",
            parameters={"type": "object", "properties": {"city": {"type": "string"}}},
            toolParams={
                "headers": {"Authorization": f"Bearer {secret}"},
                "title": "Weather API",
                "icon": "emoji:🌦️",
            },
        ),
        tool("search", f"{base}/search?lang=en", toolParams={"method": "GET"}),
        tool("words", f"{base}/words", toolParams={"method": "GET"}),
        tool("failing", f"{base}/fail", toolParams={"headers": {"Authorization": secret}}),
        tool("flooding", f"{base}/flood", toolParams={"method": "GET", "maxResponseBytes": 1000}),
        tool("sluggish", f"{base}/slow", timeoutMs=300),
        tool("moved", f"{base}/moved", toolParams={"method": "GET"}),
        tool("unset", f"{base}/words", toolParams={"headers": {"X-Key": "${ENV:AGW_TEST_UNSET}"}}),
        tool("nowhere", "http://127.0.0.1:9/none"),
    ]
    (directory / "api.backend").write_text(json.dumps({"tools": entries}))
    broken = [
        tool("put_it", f"{base}/words", toolParams={"method": "PUT", "verbose": True}),
        tool("relative", "/views/card.html"),
    ]
    (directory / "broken.backend").write_text(json.dumps({"tools": broken}))


@asynccontextmanager
async def http_gateway(
    tmp_path: Path, provider: LoopbackProvider, agents: dict[str, dict[str, Any]]
) -> AsyncIterator[tuple[Harness, Endpoint]]:
    endpoint = Endpoint()
    await endpoint.start()
    try:
        write_tools(tmp_path / "tools", endpoint.url)
        for key, definition in agents.items():
            write_agent(tmp_path / "agents", key, definition)
        async with Harness.start(
            tmp_path / "agents", provider, tools_dir=tmp_path / "tools", http_enabled=False
        ) as gateway:
            yield gateway, endpoint
    finally:
        endpoint.release.set()
        await endpoint.runner.cleanup()


def service_log(caplog: pytest.LogCaptureFixture) -> str:
    """The log lines of the service (the endpoint's access log is the endpoint's own)."""
    return "\n".join(r.getMessage() for r in caplog.records if r.name != "aiohttp.access")


@pytest.fixture(autouse=True)
def token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGW_TEST_HTTP_TOKEN", TOKEN)
    monkeypatch.delenv("AGW_TEST_UNSET", raising=False)


async def test_http_tools_are_called_and_described(
    tmp_path: Path, provider: LoopbackProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    provider.enqueue(
        call_turn(("call_w", "weather", '{"city": "Paris"}')),
        call_turn(("call_s", "search", '{"q": "a b", "tags": ["x", "y"], "n": 2, "exact": true}')),
        call_turn(("call_t", "words", "{}")),
        answer_turn("Clear in Paris."),
    )
    agents = {"api": agent(toolConfig={"backends": ["weather", "search", "words"]}, budget=BUDGET)}
    async with http_gateway(tmp_path, provider, agents) as (gateway, endpoint):
        events = await gateway.query("api", "Weather in Paris?")
        errors = gateway.app.tools.errors

    assert kinds(events) == HEAD + ["source.snapshot"] * 3 + CALL * 3 + ANSWER
    assert_invariants(events)
    base = endpoint.url
    assert snapshots(events) == [
        ("http:weather", "Weather API", f"{base}/weather", "emoji:🌦️"),
        ("http:search", "search", f"{base}/search", ""),
        ("http:words", "words", f"{base}/words", ""),
    ]
    start = events[6].tool_start
    assert (start.tool_name, start.tool_api, start.HasField("tool_params")) == (
        "weather",
        "",
        False,
    )
    assert result_of(events[10]) == {"city": "Paris", "sky": "clear", "authorized": True}
    assert endpoint.seen == [{"key": TOKEN, "authorized": True}]
    assert result_of(events[15]) == {
        "query": [
            ["lang", "en"],
            ["q", "a b"],
            ["tags", "x"],
            ["tags", "y"],
            ["n", "2"],
            ["exact", "true"],
        ]
    }
    assert result_of(events[20]) == "plain words"
    assert provider.requests[1]["messages"][-1]["content"] == json.dumps(
        {"city": "Paris", "sky": "clear", "authorized": True}
    )
    assert TOKEN not in str(events)
    assert TOKEN not in service_log(caplog)
    assert TOKEN not in str(errors)
    assert errors == {
        "broken.backend": (
            "broken.backend: 'put_it': toolParams.method: Input should be 'GET' or 'POST'; "
            "toolParams.verbose: unknown key; 'relative': toolApi: must be an http:// "
            "or https:// URL (got '/views/card.html'); 'put_it': no such built-in backend tool "
            "(a .backend file can only describe built-ins); 'relative': no such built-in "
            "backend tool (a .backend file can only describe built-ins)"
        )
    }


async def test_http_tool_failures_are_bounded_error_results(
    tmp_path: Path, provider: LoopbackProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    names = ["failing", "flooding", "sluggish", "moved", "unset", "nowhere"]
    provider.enqueue(
        *[call_turn((f"call_{n}", n, "{}")) for n in names], answer_turn("Nothing worked.")
    )
    agents = {"api": agent(toolConfig={"backends": names}, budget=BUDGET)}
    async with http_gateway(tmp_path, provider, agents) as (gateway, endpoint):
        events = await gateway.query("api", "Try everything")

    assert kinds(events) == HEAD + ["source.snapshot"] * 6 + CALL * 6 + ANSWER
    assert_invariants(events)
    results = [e for e in events if e.type == "tool.result"]
    assert all(r.tool_result.error for r in results)
    base = endpoint.url
    texts = [result_of(r) for r in results]
    body = " ".join(f"upstream down; you sent *** {' .' * 400}".split())
    assert texts[:5] == [
        f"Error: HTTP 503 from {base}/fail: {body[:300]}…",
        f"Error: the response of {base}/flood is over 1000 bytes",
        "Error: 'sluggish' timed out after 0.3 s",
        f"Error: HTTP 302 from {base}/moved: redirects are not followed",
        "Error: 'unset' is not configured: environment variable AGW_TEST_UNSET is not set",
    ]
    assert texts[5].startswith("Error: POST http://127.0.0.1:9/none failed: ClientConnectorError")
    assert events[-1].type == "run.complete"
    assert TOKEN not in str(events)
    assert TOKEN not in service_log(caplog)
