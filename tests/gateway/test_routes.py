"""Routes come from the `google.api.http` annotations, for any service.

A test-only proto (`protos/agwtest/v1/extra.proto`) is compiled here with
grpc_tools; serving it through the adapter needs no code for its RPCs.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType

import google.api
import grpc
import grpc_tools
import httpx
import httpx_sse
import orjson
import pytest
from google.api import httpbody_pb2  # type: ignore[import-untyped]
from grpc_tools import protoc

from service.gateway.routes import compile_template, routes_of
from service.gateway.server import AGENT_GATEWAY, HttpGateway
from tests.gateway.conftest import Script, ScriptedService

PROTOS = Path(__file__).parent / "protos"


@pytest.fixture(scope="session")
def extra(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """The compiled `agwtest/v1/extra.proto`, imported."""
    out = tmp_path_factory.mktemp("extra_gen")
    googleapis = Path(next(iter(google.api.__path__))).parent.parent
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    status = protoc.main(
        [
            "protoc",
            f"-I{PROTOS}",
            f"-I{googleapis}",
            f"-I{well_known}",
            f"--python_out={out}",
            "agwtest/v1/extra.proto",
        ]
    )
    assert status == 0
    name = "agwtest.v1.extra_pb2"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, out / "agwtest/v1/extra_pb2.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


@pytest.fixture
async def extra_adapter(extra: ModuleType) -> AsyncIterator[tuple[ScriptedService, str]]:
    service_descriptor = extra.DESCRIPTOR.services_by_name["Extra"]
    service = ScriptedService(service_descriptor)
    await service.server.start()
    gateway = HttpGateway(service.target, services=[service_descriptor], serve_page=False)
    await gateway.start("127.0.0.1:0")
    try:
        yield service, f"http://127.0.0.1:{gateway.port}"
    finally:
        await gateway.stop()
        await service.server.stop(None)


def test_agent_gateway_routes_are_those_of_the_proto() -> None:
    routes = {(r.method.name, r.http_method, r.template, r.body) for r in routes_of(AGENT_GATEWAY)}
    assert routes == {
        ("Query", "POST", "/api/query", "*"),
        ("Attach", "GET", "/api/runs/{run_id}/events", ""),
        ("Submit", "POST", "/api/submit", "*"),
        ("Cancel", "POST", "/api/cancel", "*"),
        ("ListAgents", "GET", "/api/agents", ""),
        ("GetAgent", "GET", "/api/agent", ""),
        ("CreateAgent", "POST", "/api/admin/agents", "*"),
        ("UpdateAgent", "PUT", "/api/admin/agents/{agent_key}", "*"),
        ("RollbackAgent", "POST", "/api/admin/agents/{agent_key}/rollback", "*"),
        ("ListAgentVersions", "GET", "/api/admin/agents/{agent_key}/versions", ""),
        ("ListChats", "GET", "/api/chats", ""),
        ("GetChat", "GET", "/api/chat", ""),
        ("RenameChat", "PATCH", "/api/chats/{chat_id}", "*"),
        ("DeleteChat", "DELETE", "/api/chats/{chat_id}", ""),
        ("GetSpend", "GET", "/api/spend", ""),
        ("Upload", "POST", "/api/upload", "*"),
        ("ListModels", "GET", "/api/models", ""),
        ("ListFiles", "GET", "/api/chats/{chat_id}/files", ""),
        ("DownloadFile", "GET", "/api/chats/{chat_id}/files/{path=**}", ""),
        ("Start", "POST", "/api/runs", "query"),
        ("Wait", "GET", "/api/runs/{run_id}/wait", ""),
        ("CreateRunWebhook", "POST", "/api/runs/{run_id}/webhooks", "webhook"),
        ("ListRunWebhooks", "GET", "/api/runs/{run_id}/webhooks", ""),
        ("GetRunWebhook", "GET", "/api/runs/{run_id}/webhooks/{webhook_id}", ""),
        ("DeleteRunWebhook", "DELETE", "/api/runs/{run_id}/webhooks/{webhook_id}", ""),
    }
    streaming = {r.method.name for r in routes_of(AGENT_GATEWAY) if r.streaming}
    assert streaming == {"Query", "Attach", "DownloadFile"}


@pytest.mark.parametrize(
    ("template", "path", "variables"),
    [
        ("/api/runs/{run_id}/events", "/api/runs/{v0:[^/]+?}/events", (("v0", "run_id"),)),
        ("/v1/{name=rooms/*}", "/v1/{v0:rooms/[^/]+?}", (("v0", "name"),)),
        ("/v1/{a.b=**}", "/v1/{v0:.+}", (("v0", "a.b"),)),
        ("/v1/*/x/{id}:cancel", "/v1/{w0:[^/]+}/x/{v0:[^/]+?}:cancel", (("v0", "id"),)),
    ],
)
def test_path_templates(template: str, path: str, variables: tuple[tuple[str, str], ...]) -> None:
    assert compile_template(template) == (path, variables)


def test_an_extra_annotated_rpc_gets_a_route(extra: ModuleType) -> None:
    routes = routes_of(extra.DESCRIPTOR.services_by_name["Extra"])
    assert [(r.method.name, r.http_method, r.template, r.body) for r in routes] == [
        ("Echo", "GET", "/v1/echo/{name}", ""),
        ("Shout", "POST", "/v1/shout", "*"),
        ("Shout", "PUT", "/v1/shout/{name}", "note"),
        ("Count", "GET", "/v1/count/{name=rooms/*}", ""),
        ("Fetch", "GET", "/v1/fetch/{name=**}", ""),
    ]


async def test_extra_rpcs_are_served_without_code_for_them(
    extra: ModuleType, extra_adapter: tuple[ScriptedService, str]
) -> None:
    service, base = extra_adapter
    service.scripts["Echo"] = Script(reply=extra.EchoReply(text="hi bob", big=2**40))
    service.scripts["Count"] = Script(
        messages=[extra.Tick(seq=1, name="a"), extra.Tick(seq=2, name="b")]
    )
    async with httpx.AsyncClient(base_url=base) as http:
        reply = await http.get(
            "/v1/echo/bob", params=[("times", "3"), ("tags", "x"), ("tags", "y")]
        )
        assert reply.status_code == 200
        assert reply.json() == {
            "code": 0,
            "msg": "success",
            "data": {"text": "hi bob", "big": 2**40},
        }
        assert service.last("Echo") == extra.EchoRequest(name="bob", times=3, tags=["x", "y"])

        reply = await http.post(
            "/v1/shout", json={"name": "ann", "loud": True, "note": {"text": "!"}}
        )
        assert reply.json()["code"] == 0
        assert service.last("Shout") == extra.EchoRequest(
            name="ann", loud=True, note=extra.Note(text="!")
        )
        reply = await http.put("/v1/shout/cy", params={"loud": "true"}, json={"text": "hey"})
        assert reply.json()["code"] == 0
        assert service.last("Shout") == extra.EchoRequest(
            name="cy", loud=True, note=extra.Note(text="hey")
        )

        async with httpx_sse.aconnect_sse(http, "GET", "/v1/count/rooms/7") as source:
            ticks = [(sse.id, orjson.loads(sse.data)) async for sse in source.aiter_sse()]
        assert ticks == [("1", {"seq": 1, "name": "a"}), ("2", {"seq": 2, "name": "b"})]
        assert service.last("Count") == extra.EchoRequest(name="rooms/7")

        assert (await http.post("/agwtest.v1.Extra/Hidden", json={})).status_code == 404
        assert (await http.get("/v1/count/elsewhere/7")).status_code == 404


async def test_a_stream_of_http_bodies_is_served_as_the_raw_bytes(
    extra: ModuleType, extra_adapter: tuple[ScriptedService, str]
) -> None:
    service, base = extra_adapter
    service.scripts["Fetch"] = Script(
        messages=[
            httpbody_pb2.HttpBody(content_type="image/png", data=b"\x89PNG"),
            httpbody_pb2.HttpBody(data=b"\r\n"),
        ]
    )
    async with httpx.AsyncClient(base_url=base) as http:
        fetched = await http.get("/v1/fetch/a/b.png")
        assert (fetched.status_code, fetched.content) == (200, b"\x89PNG\r\n")
        assert fetched.headers["content-type"] == "image/png"
        assert fetched.headers["content-disposition"] == "attachment"
        assert service.last("Fetch") == extra.EchoRequest(name="a/b.png")
        # refused before its first message: the error envelope with its HTTP status
        service.scripts["Fetch"] = Script(code=grpc.StatusCode.NOT_FOUND, details="no such file")
        missing = await http.get("/v1/fetch/x")
        assert missing.status_code == 404
        assert missing.json()["msg"] == "no such file"
        # failing after it: the connection is cut, the body is short
        service.scripts["Fetch"] = Script(
            messages=[httpbody_pb2.HttpBody(content_type="text/plain", data=b"part")],
            code=grpc.StatusCode.INTERNAL,
            details="disk gone",
        )
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get("/v1/fetch/y")
