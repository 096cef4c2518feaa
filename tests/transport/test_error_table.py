"""The error table in both directions: the service, errors.proto, the clients and the docs.

Every reason the service can send is declared in `agw.v1.ErrorReason` and every
declared reason is sent by the service; every error class reaches the Python and
the Node client through the real gRPC transport with its status, its reason and
the client class of its reason family.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import json
import os
import pkgutil
import re
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from agw.v1 import errors_pb2, gateway_pb2_grpc
from agw.v1 import gateway_pb2 as gw
from agw_client import (
    REASON_CLASSES,
    REASONS,
    AgentNotFound,
    AsyncClient,
    ChatBusy,
    ChatNotFound,
    InvalidRequest,
    Overloaded,
    PayloadTooLarge,
    ProviderNotConfigured,
    RpcError,
    RunNotFound,
    ToolNotFound,
)
from agw_client import errors as client_errors

import service
from service.core import errors as e
from service.providers.loopback import DONE, Gate, LoopbackProvider, content, finish
from service.testing import Harness, oneshot_agent, serve_gateway, write_agent
from service.transport.errors import GRPC_CODE
from service.transport.servicer import unary
from tests.transport.test_query import error_info

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "clients" / "node"
PREFIX = "ERROR_REASON_"

#: The declared reasons, in the proto's order, as sent on the wire.
DECLARED = [
    value.name.removeprefix(PREFIX)
    for value in errors_pb2.ErrorReason.DESCRIPTOR.values
    if value.number != errors_pb2.ERROR_REASON_UNSPECIFIED
]
#: The client classes named after a status code; the others are reason families.
STATUS_CLASSES = {
    cls
    for cls in vars(client_errors).values()
    if isinstance(cls, type) and cls.__bases__ == (RpcError,)
}


def _wire_classes() -> Iterator[type[e.AgwError]]:
    """Every subclass of AgwError defined anywhere in the service (all modules imported)."""
    for module in pkgutil.walk_packages(service.__path__, "service."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    pending = [e.AgwError]
    while pending:
        cls = pending.pop()
        yield cls
        pending.extend(cls.__subclasses__())


# The service and the proto --------------------------------------------------------


def test_every_reason_the_service_sends_is_declared_and_every_declared_one_is_sent() -> None:
    sent = e.reasons()
    assert sorted(sent) == sorted(DECLARED)
    assert len(DECLARED) == len(set(DECLARED))
    assert set(DECLARED) == REASONS


def test_every_error_class_with_its_own_reason_is_in_the_one_table() -> None:
    for cls in _wire_classes():
        assert cls.reason in DECLARED, cls
        if "reason" in vars(cls):
            assert cls in e.STATUS_OF, f"{cls.__module__}.{cls.__qualname__} is not in the table"
            assert cls.__module__ == "service.core.errors", cls
    assert len({cls.reason for cls in e.STATUS_OF}) == len(e.STATUS_OF)
    assert set(GRPC_CODE) == set(e.Status)
    assert all(GRPC_CODE[status].name == status.value for status in e.Status)


def test_status_codes_are_the_contract() -> None:
    assert {cls.reason: status.value for cls, status in e.STATUS_OF.items()} == {
        "INTERNAL": "INTERNAL",
        "INVALID_REQUEST": "INVALID_ARGUMENT",
        "NOT_FOUND": "NOT_FOUND",
        "AGENT_NOT_FOUND": "NOT_FOUND",
        "CHAT_NOT_FOUND": "NOT_FOUND",
        "RUN_NOT_FOUND": "NOT_FOUND",
        "TOOL_NOT_FOUND": "NOT_FOUND",
        "CONFLICT": "FAILED_PRECONDITION",
        "CHAT_BUSY": "FAILED_PRECONDITION",
        "PROVIDER_NOT_CONFIGURED": "FAILED_PRECONDITION",
        "OVERLOADED": "RESOURCE_EXHAUSTED",
        "PAYLOAD_TOO_LARGE": "RESOURCE_EXHAUSTED",
        "BUDGET_EXHAUSTED": "RESOURCE_EXHAUSTED",
        "QUOTA_EXCEEDED": "RESOURCE_EXHAUSTED",
        "SHUTTING_DOWN": "UNAVAILABLE",
        "PROVIDER_ERROR": "UNAVAILABLE",
        "PROVIDER_STREAM_ERROR": "UNAVAILABLE",
        "PROVIDER_TIMEOUT": "DEADLINE_EXCEEDED",
        "OWNER_LOST": "UNAVAILABLE",
        "BUS_UNAVAILABLE": "UNAVAILABLE",
        "RUN_HANDED_OVER": "UNAVAILABLE",
        "STORE_FAILED": "INTERNAL",
        "SANDBOX_UNAVAILABLE": "INTERNAL",
        "PLAN_FAILED": "INTERNAL",
        "UNAUTHENTICATED": "UNAUTHENTICATED",
        "PERMISSION_DENIED": "PERMISSION_DENIED",
    }
    # a subclass without its own entry takes its nearest listed base's status
    from service.core.agents.loader import AgentDefinitionError

    definition_error = AgentDefinitionError([], "agents/x.json")
    assert e.status_of(definition_error) is e.Status.INVALID_ARGUMENT
    assert definition_error.reason == "INVALID_REQUEST"


#: Calls that put a reason into an event: name → position of the reason argument.
REASON_ARGUMENT = {"run_error": 0, "task_fail": 1, "_fail": 3}


def _event_reasons() -> Iterator[tuple[str, int, str]]:
    """(file, line, reason) of every constant reason given to an event in the service."""
    for path in sorted((ROOT / "service").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name not in REASON_ARGUMENT:
                continue
            position = REASON_ARGUMENT[name]
            arguments = [k.value for k in node.keywords if k.arg == "reason"]
            arguments += node.args[position : position + 1]
            for argument in arguments:
                where = (str(path.relative_to(ROOT)), node.lineno)
                if isinstance(argument, ast.Constant):
                    yield (*where, argument.value)
                elif isinstance(argument, ast.Name) and argument.id.isupper():
                    yield (*where, getattr(e, argument.id))  # a constant of the table's module


def test_every_constant_reason_of_a_run_or_task_event_is_declared() -> None:
    found = list(_event_reasons())
    assert {reason for _, _, reason in found} == {"INTERNAL", "TASK_FAILED", "TASK_NOT_REPORTED"}
    for file, line, reason in found:
        assert reason in DECLARED, f"{file}:{line}: {reason!r} is not in errors.proto"


def test_the_docs_list_every_reason_with_its_status() -> None:
    readme = (ROOT / "docs" / "grpc.md").read_text()
    table = readme.split("<!-- The reasons, in the order of errors.proto", 1)[1].split("\n\n")[0]
    rows = re.findall(r"^\| `([A-Z_]+)` \| (?:`([A-Z_]+)`|—) \| .+ \|$", table, re.M)
    statuses = e.reasons()
    assert rows == [(r, statuses[r] or "") for r in DECLARED]


# The Python client ----------------------------------------------------------------


def test_the_python_client_has_a_class_for_each_reason_a_call_is_refused_with() -> None:
    refused = {r: status for r, status in e.reasons().items() if status is not None}
    assert set(REASON_CLASSES) == set(refused)
    for reason, status in refused.items():
        assert REASON_CLASSES[reason].status_code == GRPC_CODE[status], reason


def target(harness: Harness) -> str:
    return f"127.0.0.1:{harness.app.grpc.port}"


async def test_refused_calls_arrive_as_their_reason_family(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue([content("so far"), Gate(gate), finish("stop"), DONE])
    async with AsyncClient(target(gateway)) as agw:
        with pytest.raises(AgentNotFound) as unknown_agent:
            await agw.ask("nope", "Hi")
        with pytest.raises(RunNotFound) as unknown_run:
            await agw.cancel("no-such-run")
        with pytest.raises(RunNotFound) as unattached:
            await agw.attach("no-such-run").result()
        with pytest.raises(ChatNotFound) as unknown_chat:
            await agw.get_chat("no-such-chat")
        with pytest.raises(InvalidRequest) as invalid:
            await agw.ask("plain", "")
        stream = agw.query("plain", "go on")
        async for event in stream:
            if event.type == "content.delta":
                break
        with pytest.raises(ChatBusy) as busy:
            await agw.ask("plain", "again", chat_id=stream.chat_id)
        gate.set()
        assert (await stream.result()).outcome == "complete"
    caught = [unknown_agent, unknown_run, unattached, unknown_chat, invalid, busy]
    assert [(c.value.code.name, c.value.reason) for c in caught] == [
        ("NOT_FOUND", "AGENT_NOT_FOUND"),
        ("NOT_FOUND", "RUN_NOT_FOUND"),
        ("NOT_FOUND", "RUN_NOT_FOUND"),
        ("NOT_FOUND", "CHAT_NOT_FOUND"),
        ("INVALID_ARGUMENT", "INVALID_REQUEST"),
        ("FAILED_PRECONDITION", "CHAT_BUSY"),
    ]
    assert busy.value.metadata == {"chat_id": stream.chat_id, "run_id": stream.run_id}


async def test_limits_and_definitions_arrive_as_their_reason_family(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = tmp_path / "agents"
    write_agent(agents, "plain", oneshot_agent())
    write_agent(agents, "elsewhere", oneshot_agent(modelConfig={"providerKey": "nowhere"}))
    write_agent(agents, "toolless", oneshot_agent(toolConfig={"backends": ["missing"]}))
    gate = asyncio.Event()
    provider.enqueue([content("so far"), Gate(gate), finish("stop"), DONE])
    harness = Harness.start(agents, provider, max_concurrent_runs=1, upload_max_bytes=16)
    async with harness as started, AsyncClient(target(started)) as agw:
        with pytest.raises(ProviderNotConfigured) as unconfigured:
            await agw.ask("elsewhere", "Hi")
        with pytest.raises(ToolNotFound) as toolless:
            await agw.ask("toolless", "Hi")
        with pytest.raises(PayloadTooLarge) as too_large:
            await agw.upload("a.txt", b"x" * 17)
        stream = agw.query("plain", "go on")
        async for event in stream:
            if event.type == "content.delta":
                break
        with pytest.raises(Overloaded) as overloaded:
            await agw.ask("plain", "another chat")
        gate.set()
        assert (await stream.result()).outcome == "complete"
    caught = [unconfigured, toolless, too_large, overloaded]
    assert [(c.value.code.name, c.value.reason) for c in caught] == [
        ("FAILED_PRECONDITION", "PROVIDER_NOT_CONFIGURED"),
        ("NOT_FOUND", "TOOL_NOT_FOUND"),
        ("RESOURCE_EXHAUSTED", "PAYLOAD_TOO_LARGE"),
        ("RESOURCE_EXHAUSTED", "OVERLOADED"),
    ]


# Every class of the table, through the real transport, to both clients ------------


def _instance(cls: type[e.AgwError]) -> e.AgwError:
    if issubclass(cls, e.ProviderError):
        return cls("fake", "it failed", status=502)
    return cls(f"{cls.__name__} it is", detail="x")


class RaisingServicer(gateway_pb2_grpc.AgentGatewayServicer):
    """GetAgent raises the error of the table whose class is named by `agentKey`."""

    @unary
    async def GetAgent(self, request: gw.GetAgentRequest, context: Any) -> gw.GetAgentResponse:
        raise _instance(next(c for c in e.STATUS_OF if c.__name__ == request.agent_key))


@pytest.fixture
async def raising() -> AsyncIterator[str]:
    async with serve_gateway(RaisingServicer()) as target:
        yield target


async def test_every_error_class_arrives_in_the_python_client(raising: str) -> None:
    async with AsyncClient(raising, retries=0) as agw:
        for cls, status in e.STATUS_OF.items():
            with pytest.raises(RpcError) as caught:
                await agw.get_agent(cls.__name__)
            error = caught.value
            assert type(error) is REASON_CLASSES[cls.reason], cls
            assert (error.code, error.reason, error.domain) == (
                GRPC_CODE[status],
                cls.reason,
                "agw.v1",
            )
            assert error.message == _instance(cls).message
            assert error.metadata == _instance(cls).metadata


NODE_SCRIPT = """
const { AgwClient, ERROR_CLASSES } = require('./index.js');
const agw = new AgwClient(process.env.AGW_TARGET, { retries: 0 });
(async () => {
  const seen = [];
  for (const name of JSON.parse(process.env.CLASSES)) {
    try { await agw.getAgent(name); seen.push([name, 'none']); }
    catch (error) { seen.push([name, error.name, error.code, error.reason, error.domain]); }
  }
  const table = Object.fromEntries(Object.entries(ERROR_CLASSES).map(([r, c]) => [r, c.name]));
  console.log(JSON.stringify({ seen, table, reasons: [...agw.reasons] }));
  agw.close();
})();
"""


async def test_every_error_class_arrives_in_the_node_client(raising: str) -> None:
    node = shutil.which("node")
    assert node, "Node.js is needed for the Node client's tests"
    names = [cls.__name__ for cls in e.STATUS_OF]
    env = {**os.environ, "AGW_TARGET": raising, "CLASSES": json.dumps(names)}
    process = await asyncio.create_subprocess_exec(
        node, "-e", NODE_SCRIPT, cwd=NODE_DIR, env=env, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0
    report = json.loads(out)
    assert report["reasons"] == DECLARED
    # the Node client's families are the Python client's, for the same reasons
    families = {r: c.__name__ for r, c in REASON_CLASSES.items() if c not in STATUS_CLASSES}
    assert report["table"] == families
    assert report["seen"] == [
        [
            cls.__name__,
            families.get(cls.reason, "AgwError"),
            GRPC_CODE[status].value[0],
            cls.reason,
            "agw.v1",
        ]
        for cls, status in e.STATUS_OF.items()
    ]


def test_the_node_types_list_every_reason() -> None:
    types = (NODE_DIR / "index.d.ts").read_text()
    union = re.search(r"export type ErrorReason =(.*?);", types, re.S)
    assert union is not None
    assert re.findall(r"'([A-Z_]+)'", union.group(1)) == DECLARED


class EchoingServicer(gateway_pb2_grpc.AgentGatewayServicer):
    """GetAgent refuses `agentKey`, echoing it whole in the message and the metadata."""

    @unary
    async def GetAgent(self, request: gw.GetAgentRequest, context: Any) -> gw.GetAgentResponse:
        raise e.InvalidRequest(request.agent_key, agent_key=request.agent_key)


@pytest.mark.parametrize("piece", ["🙂", "é", "x"])
async def test_statuses_are_cut_by_their_utf8_bytes(piece: str) -> None:
    """Cut by characters, 1,024 emoji took 12 KiB of trailers once percent-encoded: the
    client refused the status (RESOURCE_EXHAUSTED) instead of reporting it."""
    server = grpc.aio.server()
    gateway_pb2_grpc.add_AgentGatewayServicer_to_server(EchoingServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = gateway_pb2_grpc.AgentGatewayStub(channel)
            for _ in range(5):  # past 8 KiB of trailers, gRPC refuses some statuses at random
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.GetAgent(gw.GetAgentRequest(agent_key=piece * 3000))
                error = caught.value
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()[:200]
                size = len(piece.encode())
                assert error.details() == piece * (1024 // size) + "…"
                (key, value), *_ = error_info(error).metadata.items()
                assert (key, value) == ("agent_key", piece * (256 // size) + "…")
    finally:
        await server.stop(None)
