"""Authentication and ownership, through the real gRPC transport (and the HTTP adapter).

Two principals share one gateway: neither can list, read, attach to, answer,
cancel, continue or reference what the other one owns; each is refused with
NOT_FOUND (or UNKNOWN_RUN for Submit), exactly as if the thing did not exist.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import jwt
import pytest
from agw.v1 import gateway_pb2 as gw
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa

from service.assembly.config import ApiKeySettings, Settings
from service.assembly.security import UnsafeExposure, check_exposure, is_loopback
from service.providers.loopback import LoopbackProvider
from service.testing import Harness
from service.transport.auth import api_key
from tests.core.tools.kit import agent, answer_turn, call_turn, tool_gateway, tools
from tests.transport.test_query import error_info

KEYS = [
    ApiKeySettings(key="key-alice-1234567890", tenant="acme", subject="alice"),
    ApiKeySettings(key="key-bob-1234567890", tenant="acme", subject="bob"),
]
ALICE = (("authorization", "Bearer key-alice-1234567890"),)
BOB = (("authorization", "Bearer key-bob-1234567890"),)
AGENTS = {"plain": agent(), "ui": agent(toolConfig=tools(frontends=("pick",)))}


@pytest.fixture
async def secured(tmp_path: Path, provider: LoopbackProvider) -> AsyncIterator[Harness]:
    async with tool_gateway(tmp_path, provider, AGENTS, auth_api_keys=KEYS) as gateway:
        yield gateway


async def query(gateway: Harness, who: Any, message: str = "Hi", **fields: Any) -> list[Any]:
    request = gw.QueryRequest(agent_key="plain", message=message, **fields)
    return [event async for event in gateway.stub.Query(request, metadata=who)]


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        result = call()
        if hasattr(result, "__aiter__"):
            async for _ in result:
                pass
        else:
            await result
    return caught.value


async def test_calls_without_valid_credentials_are_unauthenticated(secured: Harness) -> None:
    stub = secured.stub
    for metadata in [
        (),
        (("authorization", "key-alice-1234567890"),),  # no scheme
        (("authorization", "Bearer wrong-key"),),
        (("authorization", "Basic a2V5LWFsaWNl"),),
        (("authorization", "Bearer a.b.c"),),  # looks like a JWT; none configured
    ]:
        for call in [
            lambda m=metadata: stub.ListAgents(gw.ListAgentsRequest(), metadata=m),
            lambda m=metadata: stub.ListChats(gw.ListChatsRequest(), metadata=m),
            lambda m=metadata: stub.Query(
                gw.QueryRequest(agent_key="plain", message="x"), metadata=m
            ),
            lambda m=metadata: stub.Attach(gw.AttachRequest(run_id="r"), metadata=m),
        ]:
            error = await refused(call)
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED, metadata
            assert error_info(error).reason == "UNAUTHENTICATED"
    agents = await stub.ListAgents(gw.ListAgentsRequest(), metadata=ALICE)
    assert {a.key for a in agents.agents} == {"plain", "ui"}
    assert secured.app.frontdoor.active_runs == 0


async def test_a_principal_sees_only_its_own_chats_and_runs(
    secured: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(answer_turn("Hello Alice"), answer_turn("Hello Bob"))
    alice = await query(secured, ALICE)
    bob = await query(secured, BOB)
    assert [e.type for e in alice][-1] == [e.type for e in bob][-1] == "run.complete"
    chat_a, run_a = alice[0].chat_id, alice[0].run_id
    await secured.app.frontdoor.flush()
    stub = secured.stub
    mine = await stub.ListChats(gw.ListChatsRequest(), metadata=ALICE)
    assert [c.chat_id for c in mine.chats] == [chat_a]
    theirs = await stub.ListChats(gw.ListChatsRequest(), metadata=BOB)
    assert [c.chat_id for c in theirs.chats] == [bob[0].chat_id]

    chat = await stub.GetChat(gw.GetChatRequest(chat_id=chat_a), metadata=ALICE)
    assert chat.chat_id == chat_a and chat.events
    for call in [
        lambda: stub.GetChat(gw.GetChatRequest(chat_id=chat_a), metadata=BOB),
        lambda: stub.Attach(gw.AttachRequest(run_id=run_a), metadata=BOB),
        lambda: stub.Cancel(gw.CancelRequest(run_id=run_a), metadata=BOB),
        lambda: stub.Query(
            gw.QueryRequest(agent_key="plain", message="mine now", chat_id=chat_a), metadata=BOB
        ),
    ]:
        error = await refused(call)
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert error_info(error).reason in {"CHAT_NOT_FOUND", "RUN_NOT_FOUND"}
    replay = [e async for e in stub.Attach(gw.AttachRequest(run_id=run_a), metadata=ALICE)]
    assert [e.seq for e in replay] == [e.seq for e in alice]
    # the refused continuation wrote nothing into Alice's chat
    again = await stub.GetChat(gw.GetChatRequest(chat_id=chat_a), metadata=ALICE)
    assert list(again.events) == list(chat.events)


async def test_another_principal_cannot_answer_or_cancel_a_waiting_run(
    secured: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(call_turn(("c1", "pick", '{"options":["a","b"]}')), answer_turn("a it is"))
    request = gw.QueryRequest(agent_key="ui", message="Pick one")
    call = secured.stub.Query(request, metadata=ALICE)
    events = []
    async for event in call:
        events.append(event)
        if event.type == "tool.end":
            break
    run_id, tool_id = event.run_id, event.tool_end.tool_id
    submit = gw.SubmitRequest(run_id=run_id, tool_id=tool_id)
    submit.payload.string_value = "b"
    reply = await secured.stub.Submit(submit, metadata=BOB)
    assert reply.outcome == gw.SUBMIT_OUTCOME_UNKNOWN_RUN and not reply.accepted
    error = await refused(
        lambda: secured.stub.Cancel(gw.CancelRequest(run_id=run_id), metadata=BOB)
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert secured.app.bus.waits.waiting(run_id) == [tool_id]
    submit.payload.string_value = "a"
    reply = await secured.stub.Submit(submit, metadata=ALICE)
    assert reply.outcome == gw.SUBMIT_OUTCOME_ACCEPTED
    events += [event async for event in call]
    submitted = [e.request_submit.payload.string_value for e in events if e.request_submit.tool_id]
    assert submitted == ["a"] and events[-1].type == "run.complete"


async def test_uploads_belong_to_their_owner(secured: Harness, provider: LoopbackProvider) -> None:
    upload = await secured.stub.Upload(
        gw.UploadRequest(name="notes.txt", content=b"secret notes"), metadata=ALICE
    )
    reference = upload.reference
    provider.enqueue(answer_turn("Read it"))
    events = await query(secured, ALICE, references=[reference])
    assert events[-1].type == "run.complete"
    assert "secret notes" in json.dumps(provider.requests[-1]["messages"])
    error = await refused(lambda: query(secured, BOB, references=[reference]))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert len(provider.requests) == 1


async def test_records_carry_the_owner(secured: Harness, provider: LoopbackProvider) -> None:
    provider.enqueue(answer_turn("Hi"))
    events = await query(secured, ALICE)
    await secured.app.frontdoor.flush()
    chat = await secured.stub.GetChat(
        gw.GetChatRequest(chat_id=events[0].chat_id, include_raw_messages=True), metadata=ALICE
    )
    first = dict(chat.raw_messages[0])
    assert dict(first["owner"]) == {"tenant": "acme", "subject": "alice"}


async def test_the_http_adapter_forwards_the_authorization_header(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents_dir = tmp_path / "agents"
    agents_dir.mkdir()
    (agents_dir / "plain.json").write_text(json.dumps(agent()))
    async with (
        Harness.start(agents_dir, provider, auth_api_keys=KEYS) as gateway,
        httpx.AsyncClient(base_url=gateway.http_url) as http,
    ):
        anonymous = await http.get("/api/agents")
        assert anonymous.status_code == 401
        assert anonymous.json()["reason"] == "UNAUTHENTICATED"
        assert "key-alice" not in anonymous.text
        ok = await http.get("/api/agents", headers={"Authorization": "Bearer key-bob-1234567890"})
        assert ok.status_code == 200 and ok.json()["code"] == 0


# JWT ---------------------------------------------------------------------------------------


@pytest.fixture
def signing_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
async def jwks_url(signing_key: rsa.RSAPrivateKey) -> AsyncIterator[str]:
    """An issuer's JWKS document, served on loopback."""
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(signing_key.public_key()))
    jwk.update(kid="k1", use="sig", alg="RS256")

    async def keys(request: web.Request) -> web.Response:
        return web.json_response({"keys": [jwk]})

    app = web.Application()
    app.router.add_get("/.well-known/jwks.json", keys)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/.well-known/jwks.json"
    finally:
        await runner.cleanup()


def token(key: rsa.RSAPrivateKey, **claims: Any) -> str:
    now = int(time.time())
    body = {
        "iss": "https://issuer.test",
        "aud": "agw",
        "sub": "carol",
        "tenant": "globex",
        "iat": now,
        "exp": now + 300,
        **claims,
    }
    return jwt.encode(
        {k: v for k, v in body.items() if v is not None}, key, "RS256", headers={"kid": "k1"}
    )


async def test_jwt_bearer_tokens_from_a_jwks_url(
    tmp_path: Path, provider: LoopbackProvider, signing_key: rsa.RSAPrivateKey, jwks_url: str
) -> None:
    settings = {
        "auth_jwt_jwks_url": jwks_url,
        "auth_jwt_issuer": "https://issuer.test",
        "auth_jwt_audience": "agw",
    }
    async with tool_gateway(tmp_path, provider, AGENTS, **settings) as gateway:
        provider.enqueue(answer_turn("Hi Carol"))
        carol = (("authorization", f"Bearer {token(signing_key)}"),)
        events = await query(gateway, carol)
        assert events[-1].type == "run.complete"
        assert gateway.app.frontdoor.runs[events[0].run_id].owner.subject == "carol"
        other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        for bad in [
            token(signing_key, exp=int(time.time()) - 3600),  # expired
            token(signing_key, aud="someone-else"),
            token(signing_key, iss="https://evil.test"),
            token(signing_key, sub=None),
            token(other),  # signed by another key
            token(signing_key)[:-4] + "AAAA",  # signature tampered with
        ]:
            error = await refused(
                lambda b=bad: gateway.stub.ListChats(
                    gw.ListChatsRequest(), metadata=(("authorization", f"Bearer {b}"),)
                )
            )
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        none_alg = (
            base64.urlsafe_b64encode(b'{"alg":"none","typ":"JWT"}').rstrip(b"=").decode()
            + "."
            + base64.urlsafe_b64encode(json.dumps({"sub": "mallory"}).encode())
            .rstrip(b"=")
            .decode()
            + "."
        )
        error = await refused(
            lambda: gateway.stub.ListChats(
                gw.ListChatsRequest(), metadata=(("authorization", f"Bearer {none_alg}"),)
            )
        )
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        mine = await gateway.stub.ListChats(gw.ListChatsRequest(), metadata=carol)
        assert [c.chat_id for c in mine.chats] == [events[0].chat_id]


async def test_hmac_jwt_and_tenant_isolation(tmp_path: Path, provider: LoopbackProvider) -> None:
    secret = "a-long-shared-secret-for-tests-only"
    async with tool_gateway(tmp_path, provider, AGENTS, auth_jwt_secret=secret) as gateway:
        now = int(time.time())

        def bearer(tenant: str) -> tuple[tuple[str, str], ...]:
            claims = {"sub": "dave", "tenant": tenant, "exp": now + 60}
            return (("authorization", f"Bearer {jwt.encode(claims, secret, 'HS256')}"),)

        provider.enqueue(answer_turn("Hi"))
        events = await query(gateway, bearer("t1"))
        await gateway.app.frontdoor.flush()
        same_subject_other_tenant = await gateway.stub.ListChats(
            gw.ListChatsRequest(), metadata=bearer("t2")
        )
        assert list(same_subject_other_tenant.chats) == []
        mine = await gateway.stub.ListChats(gw.ListChatsRequest(), metadata=bearer("t1"))
        assert [c.chat_id for c in mine.chats] == [events[0].chat_id]


# Exposure and keys -------------------------------------------------------------------------


def test_a_non_loopback_address_without_authentication_refuses_to_start() -> None:
    assert is_loopback("127.0.0.1:1") and is_loopback("localhost:1") and is_loopback("[::1]:1")
    assert not is_loopback("0.0.0.0:1") and not is_loopback(":1") and not is_loopback("[::]:1")
    exposed = Settings(grpc_address="0.0.0.0:50051", http_enabled=False)
    from service.assembly.security import authenticator

    with pytest.raises(UnsafeExposure, match=r"refusing to serve 0\.0\.0\.0:50051"):
        check_exposure(exposed, authenticator(exposed))
    http_exposed = Settings(http_address="0.0.0.0:8080")
    with pytest.raises(UnsafeExposure, match=r"0\.0\.0\.0:8080"):
        check_exposure(http_exposed, authenticator(http_exposed))
    allowed = Settings(grpc_address="0.0.0.0:50051", allow_unauthenticated=True)
    check_exposure(allowed, authenticator(allowed))
    keyed = Settings(grpc_address="0.0.0.0:50051", auth_api_keys=KEYS[:1])
    check_exposure(keyed, authenticator(keyed))


async def test_keys_may_be_configured_by_their_digest(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    digest = api_key("plain-text-key", "t", "s").sha256
    keys = [ApiKeySettings(key=f"sha256:{digest}", subject="s", tenant="t")]
    async with tool_gateway(tmp_path, provider, AGENTS, auth_api_keys=keys) as gateway:
        ok = await gateway.stub.ListAgents(
            gw.ListAgentsRequest(), metadata=(("authorization", "Bearer plain-text-key"),)
        )
        assert len(ok.agents) == 2
        error = await refused(
            lambda: gateway.stub.ListAgents(
                gw.ListAgentsRequest(), metadata=(("authorization", f"Bearer sha256:{digest}"),)
            )
        )
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_unauthenticated_calls_start_nothing(secured: Harness) -> None:
    calls = [
        secured.stub.Query(gw.QueryRequest(agent_key="plain", message=f"m{n}")) for n in range(50)
    ]

    async def drain(call: Any) -> grpc.StatusCode:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in call:
                pass
        return caught.value.code()

    codes = await asyncio.gather(*(drain(c) for c in calls))
    assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}
    assert secured.app.frontdoor.active_runs == 0 and not secured.app.frontdoor.runs
