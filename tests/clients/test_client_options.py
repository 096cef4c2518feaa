"""Connection options of the Python client: retries, metadata, deadlines, TLS.

These need a server that misbehaves on purpose, so they run against a fake
`AgentGateway` servicer (an edge fake) on a real loopback gRPC server.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc
from agw_client import (
    AsyncClient,
    Client,
    ClientOptions,
    DeadlineExceeded,
    RunHandedOver,
    Unavailable,
)

from service.core.errors import RunHandedOver as HandedOver
from service.transport.errors import abort

Context = grpc.aio.ServicerContext[Any, Any]


class FlakyGateway(gateway_pb2_grpc.AgentGatewayServicer):
    """Answers UNAVAILABLE `failures` times per method, then succeeds; records metadata."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls: dict[str, int] = {}
        self.metadata: list[dict[str, str]] = []
        self.never = asyncio.Event()

    async def _enter(self, method: str, context: Context) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1
        self.metadata.append({k: str(v) for k, v in context.invocation_metadata() or ()})
        if self.calls[method] <= self.failures:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "try again")

    async def ListAgents(self, request: Any, context: Context) -> gw.ListAgentsResponse:
        await self._enter("ListAgents", context)
        return gw.ListAgentsResponse(agents=[gw.Agent(key="a")])

    async def GetAgent(self, request: Any, context: Context) -> gw.GetAgentResponse:
        await self._enter("GetAgent", context)
        await self.never.wait()
        raise AssertionError("unreachable")

    async def Query(self, request: Any, context: Context) -> None:  # type: ignore[override]
        await self._enter("Query", context)
        await context.write(pb.Event(seq=1, type="run.start", run_start=pb.RunStart()))


async def serve(servicer: FlakyGateway, credentials: Any = None) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    gateway_pb2_grpc.add_AgentGatewayServicer_to_server(servicer, server)
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    return server, port


@pytest.fixture
async def flaky() -> AsyncIterator[tuple[FlakyGateway, int]]:
    servicer = FlakyGateway(failures=2)  # type: ignore[abstract]
    server, port = await serve(servicer)
    yield servicer, port
    servicer.never.set()
    await server.stop(None)


async def test_unary_calls_are_retried_on_unavailable(flaky: tuple[FlakyGateway, int]) -> None:
    servicer, port = flaky
    async with AsyncClient(f"127.0.0.1:{port}", retry_backoff=0.01) as agw:
        agents = await agw.list_agents()
    assert [a.key for a in agents] == ["a"]
    assert servicer.calls["ListAgents"] == 3


async def test_retries_give_up_and_raise_unavailable(flaky: tuple[FlakyGateway, int]) -> None:
    servicer, port = flaky
    async with AsyncClient(f"127.0.0.1:{port}", retries=1, retry_backoff=0.01) as agw:
        with pytest.raises(Unavailable) as caught:
            await agw.list_agents()
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert caught.value.message == "try again"
    assert servicer.calls["ListAgents"] == 2


async def test_streams_are_never_retried(flaky: tuple[FlakyGateway, int]) -> None:
    servicer, port = flaky
    async with AsyncClient(f"127.0.0.1:{port}", retry_backoff=0.01) as agw:
        with pytest.raises(Unavailable):
            [e async for e in agw.query("a", "hi")]
    assert servicer.calls["Query"] == 1


async def test_token_and_metadata_go_with_every_call(flaky: tuple[FlakyGateway, int]) -> None:
    servicer, port = flaky
    options = ClientOptions(
        f"127.0.0.1:{port}", token="s3cret", metadata=(("x-tenant", "acme"),), retries=0
    )
    async with AsyncClient(options=options) as agw:
        with pytest.raises(Unavailable):
            await agw.list_agents()
        with pytest.raises(Unavailable):
            [e async for e in agw.query("a", "hi")]
    for seen in servicer.metadata:
        assert seen["authorization"] == "Bearer s3cret"
        assert seen["x-tenant"] == "acme"
    assert len(servicer.metadata) == 2


async def test_unary_deadline(flaky: tuple[FlakyGateway, int]) -> None:
    servicer, port = flaky
    servicer.failures = 0
    async with AsyncClient(f"127.0.0.1:{port}", timeout=5.0) as agw:
        with pytest.raises(DeadlineExceeded):
            await agw.get_agent("a", deadline=0.05)


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="retries"):
        ClientOptions(retries=5)
    assert ClientOptions(retries=0).service_config() == {}
    with pytest.raises(TypeError):
        AsyncClient("127.0.0.1:1", options=ClientOptions())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_the_default_target_is_agw_target_else_make_run_s(
    flaky: tuple[FlakyGateway, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, port = flaky
    monkeypatch.delenv("AGW_TARGET", raising=False)
    assert ClientOptions().target == "127.0.0.1:50051"
    monkeypatch.setenv("AGW_TARGET", f"127.0.0.1:{port}")
    assert ClientOptions().target == f"127.0.0.1:{port}"
    assert ClientOptions("elsewhere:1").target == "elsewhere:1"
    async with AsyncClient(retry_backoff=0.01) as agw:  # reaches the server AGW_TARGET names
        assert [a.key for a in await agw.list_agents()] == ["a"]


async def test_tls_with_own_root_certificate(tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    openssl = await asyncio.create_subprocess_exec(
        *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
        *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"),
        *("-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert await openssl.wait() == 0
    credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
    servicer = FlakyGateway()  # type: ignore[abstract]
    server, port = await serve(servicer, credentials)
    try:
        async with AsyncClient(
            f"127.0.0.1:{port}", tls=True, root_certificates=cert.read_bytes()
        ) as agw:
            assert [a.key for a in await agw.list_agents()] == ["a"]
        async with AsyncClient(f"127.0.0.1:{port}", retries=0) as plaintext:
            with pytest.raises(Unavailable):
                await plaintext.list_agents(deadline=2)
    finally:
        await server.stop(None)


# A stream follows its run -----------------------------------------------------------------


class HandingOver(gateway_pb2_grpc.AgentGatewayServicer):
    """A run of `total` events whose stream is cut after every `cut` events: ended with
    UNAVAILABLE RUN_HANDED_OVER (as a draining process does), or, `lost`, by the connection
    (UNAVAILABLE with no reason); Attach goes on after its `after_seq`."""

    def __init__(self, total: int, cut: int, *, lost: bool = False) -> None:
        self.total, self.cut, self.lost = total, cut, lost
        self.calls: list[tuple[str, int]] = []  # (method, after_seq)

    async def _run(self, after_seq: int, context: Context) -> None:
        for seq in range(after_seq + 1, min(after_seq + self.cut, self.total) + 1):
            await context.write(pb.Event(seq=seq, run_id="r1", type="content.delta"))
        if after_seq + self.cut < self.total:
            if self.lost:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "Connection reset")
            last = str(min(after_seq + self.cut, self.total))
            error = HandedOver("handed over", run_id="r1", after_seq=last)
            await abort(context, error)

    async def Query(self, request: Any, context: Context) -> None:  # type: ignore[override]
        self.calls.append(("Query", 0))
        await self._run(0, context)

    async def Attach(self, request: Any, context: Context) -> None:  # type: ignore[override]
        self.calls.append(("Attach", request.after_seq))
        await self._run(request.after_seq, context)


@pytest.mark.parametrize("lost", [False, True], ids=["handed-over", "connection-lost"])
async def test_a_stream_re_attaches_after_its_last_seq_until_its_run_ends(lost: bool) -> None:
    servicer = HandingOver(total=10, cut=4, lost=lost)
    server, port = await serve(servicer)  # type: ignore[arg-type]
    try:
        async with AsyncClient(f"127.0.0.1:{port}", retry_backoff=0.01) as agw:
            stream = agw.query("a", "hi")
            seqs = [event.seq async for event in stream]
        assert seqs == list(range(1, 11))
        assert servicer.calls == [("Query", 0), ("Attach", 4), ("Attach", 8)]
        assert (stream.reattached, stream.last_seq) == (2, 10)

        def blocking() -> tuple[list[int], int]:
            with Client(f"127.0.0.1:{port}", retry_backoff=0.01) as agw:
                stream = agw.attach("r1", 2)
                return [event.seq for event in stream], stream.reattached

        servicer.calls = []
        assert await asyncio.to_thread(blocking) == (list(range(3, 11)), 1)
        assert servicer.calls == [("Attach", 2), ("Attach", 6)]
    finally:
        await server.stop(None)


async def test_a_stream_gives_up_after_its_attempts_without_a_new_event() -> None:
    servicer = HandingOver(total=10, cut=0)  # every stream is cut before an event
    server, port = await serve(servicer)  # type: ignore[arg-type]
    try:
        async with AsyncClient(f"127.0.0.1:{port}", retry_backoff=0.01, reattach_attempts=3) as agw:
            stream = agw.attach("r1", 5)
            with pytest.raises(RunHandedOver) as caught:
                [event async for event in stream]
            assert caught.value.metadata == {"run_id": "r1", "after_seq": "5"}
            assert servicer.calls == [("Attach", 5)] * 4  # the first call, and 3 attempts
        async with AsyncClient(f"127.0.0.1:{port}", retry_backoff=0.01, reattach_attempts=0) as agw:
            servicer.calls = []
            with pytest.raises(RunHandedOver):
                [event async for event in agw.attach("r1", 5)]
            assert servicer.calls == [("Attach", 5)]
    finally:
        await server.stop(None)
    with pytest.raises(ValueError, match="reattach_attempts"):
        ClientOptions(reattach_attempts=-1)
