"""Quotas per tenant and per API key, and the spend ledger, through the real service.

Queries past a limit are refused RESOURCE_EXHAUSTED, reason QUOTA_EXCEEDED, with the
quota, its scope and limit and when to retry (metadata, a RetryInfo detail, HTTP's
Retry-After); what runs use is in the ledger, read with GetSpend. Two replicas sharing
one Redis share the counters: a limit holds across them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from agw.v1 import gateway_pb2 as gw
from agw_client import AsyncClient, InvalidRequest, PermissionDenied, QuotaExceeded
from google.rpc import error_details_pb2, status_pb2

from service.assembly.config import ApiKeySettings, QuotaSettings
from service.providers.loopback import DONE, Gate, LoopbackProvider, content, finish, usage
from service.testing import Harness, oneshot_agent, write_agent
from service.testing.harness import FAKE_MODEL

RUN = ["request.query", "chat.start", "run.start", "content.start", "content.delta"]
RUN += ["content.end", "usage.update", "run.complete"]  # usage.update: the model is priced


def answer(text: str = "ok") -> list[Any]:
    return [content(text), finish("stop"), usage(10, 5), DONE]


def key(name: str, tenant: str = "acme", **quota: Any) -> ApiKeySettings:
    return ApiKeySettings(
        key=f"key-{name}-1234567890",
        tenant=tenant,
        subject=name,
        roles=["admin"] if name == "root" else [],
        quota=QuotaSettings(**quota) if quota else None,
    )


KEYS = [
    key("ci", requests_per_minute=2),
    key("alice"),
    key("bob", tenant="globex"),
    key("root", tenant="ops"),
]


def agents(tmp_path: Path) -> Path:
    directory = tmp_path / "agents"
    write_agent(directory, "plain", oneshot_agent())
    write_agent(directory, "other", oneshot_agent())
    return directory


def client(gateway: Harness, name: str) -> AsyncClient:
    target = f"127.0.0.1:{gateway.app.grpc.port}"
    return AsyncClient(target, token=f"key-{name}-1234567890", retries=0)


@pytest.fixture
async def gateway(tmp_path: Path, provider: LoopbackProvider) -> AsyncIterator[Harness]:
    async with Harness.start(
        agents(tmp_path),
        provider,
        auth_api_keys=KEYS,
        tenant_quotas={
            "acme": QuotaSettings(concurrent_runs=1, tokens_per_day=60),
            "*": QuotaSettings(spend_per_month=0.02),
        },
        prices={FAKE_MODEL: {"input_per_million": 1000, "output_per_million": 2000}},
    ) as harness:
        yield harness


def retry_info(error: grpc.aio.AioRpcError) -> float:
    for k, value in error.trailing_metadata() or ():
        if k == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.RetryInfo()
                if detail.Unpack(info):
                    return info.retry_delay.ToMilliseconds() / 1000
    raise AssertionError("no RetryInfo")


async def test_a_key_over_its_requests_per_minute_is_refused_with_when_to_retry(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(answer(), answer(), answer())
    async with client(gateway, "ci") as ci, client(gateway, "alice") as alice:
        for _ in range(2):
            assert [e.type async for e in ci.query("plain", "Hi")] == RUN
        with pytest.raises(QuotaExceeded) as refused:
            await ci.ask("plain", "Hi")
        error = refused.value
        assert (error.code, error.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "QUOTA_EXCEEDED")
        assert {k: v for k, v in error.metadata.items() if k != "retry_after_s"} == {
            "quota": "requests_per_minute",
            "scope": "key",
            "limit": "2",
        }
        assert error.retry_after is not None and 0 < error.retry_after <= 60
        assert "key 'ci' used its quota of 2 requests a minute" in error.message
        # the same tenant's other key has no such limit
        assert [e.type async for e in alice.query("plain", "Hi")] == RUN
    request = gw.QueryRequest(agent_key="plain", message="Hi")
    metadata = (("authorization", "Bearer key-ci-1234567890"),)
    with pytest.raises(grpc.aio.AioRpcError) as raw:
        async for _ in gateway.stub.Query(request, metadata=metadata):
            pass
    assert 0 < retry_info(raw.value) <= 60
    async with httpx.AsyncClient(base_url=gateway.http_url) as http:
        answered = await http.post(
            "/api/query",
            json={"agentKey": "plain", "message": "Hi"},
            headers={"Authorization": "Bearer key-ci-1234567890"},
        )
    assert answered.status_code == 429
    assert answered.json()["reason"] == "QUOTA_EXCEEDED"
    assert 1 <= int(answered.headers["Retry-After"]) <= 60


async def test_a_tenant_runs_at_most_its_concurrent_runs_and_gets_the_slot_back(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue([content("so far"), Gate(gate), finish("stop"), DONE], answer())
    async with client(gateway, "alice") as alice, client(gateway, "bob") as bob:
        stream = alice.query("plain", "Slow")
        async for event in stream:
            if event.type == "content.delta":
                break
        with pytest.raises(QuotaExceeded) as refused:
            await alice.ask("plain", "Another")
        assert refused.value.metadata["quota"] == "concurrent_runs"
        assert refused.value.metadata["scope"] == "tenant"
        assert refused.value.retry_after == 5.0
        provider.enqueue(answer())
        assert (await bob.ask("plain", "Other tenant")).outcome == "complete"
        gate.set()
        assert (await stream.result()).outcome == "complete"
        await asyncio.sleep(0.05)  # the slot is given back as the run's task ends
        assert (await alice.ask("plain", "Now")).outcome == "complete"


async def test_tokens_per_day_and_spend_per_month_refuse_the_next_query(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(*(answer() for _ in range(5)))
    async with client(gateway, "alice") as alice, client(gateway, "bob") as bob:
        for _ in range(4):  # 15 tokens each: the fourth reaches 60
            assert (await alice.ask("plain", "Hi")).outcome == "complete"
        await gateway.app.frontdoor.quotas.flush()  # type: ignore[union-attr]
        with pytest.raises(QuotaExceeded) as tokens:
            await alice.ask("plain", "Hi")
        assert (tokens.value.metadata["quota"], tokens.value.metadata["limit"]) == (
            "tokens_per_day",
            "60",
        )
        assert 0 < (tokens.value.retry_after or 0) <= 86400
        # globex has the "*" tenants' limit: 0.02 of spend; a call costs 10 × 1000/1e6 +
        # 5 × 2000/1e6 = 0.02
        assert (await bob.ask("plain", "Hi")).outcome == "complete"
        await gateway.app.frontdoor.quotas.flush()  # type: ignore[union-attr]
        with pytest.raises(QuotaExceeded) as spend:
            await bob.ask("plain", "Hi")
        assert spend.value.metadata["quota"] == "spend_per_month"
        assert 0 < (spend.value.retry_after or 0) <= 31 * 86400


async def test_the_spend_ledger_is_read_by_tenant_and_by_admins(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(*(answer() for _ in range(4)))
    async with (
        client(gateway, "ci") as ci,
        client(gateway, "alice") as alice,
        client(gateway, "bob") as bob,
        client(gateway, "root") as root,
    ):
        await ci.ask("plain", "Hi")
        await ci.ask("other", "Hi")
        await alice.ask("plain", "Hi")
        await bob.ask("plain", "Hi")
        mine = await alice.get_spend()
        assert mine.currency == "USD"
        assert mine.first_day[:8] == mine.last_day[:8] and mine.first_day.endswith("-01")
        rows = [(r.api_key, r.agent_key, r.model, r.calls, r.prompt_tokens) for r in mine.rows]
        assert rows == [
            ("alice", "plain", FAKE_MODEL, 1, 10),
            ("ci", "other", FAKE_MODEL, 1, 10),
            ("ci", "plain", FAKE_MODEL, 1, 10),
        ]
        assert all(r.tenant == "acme" and r.completion_tokens == 5 for r in mine.rows)
        assert all(r.cost == pytest.approx(0.02) for r in mine.rows)
        with pytest.raises(PermissionDenied) as denied:
            await alice.get_spend(tenant="globex")
        assert (denied.value.reason, denied.value.metadata) == (
            "PERMISSION_DENIED",
            {"role": "admin"},
        )
        assert [r.tenant for r in (await root.get_spend(tenant="*")).rows] == [
            "acme",
            "acme",
            "acme",
            "globex",
        ]
        assert [r.api_key for r in (await root.get_spend(tenant="globex")).rows] == ["bob"]
        assert list((await bob.get_spend(first_day="2020-01-01", last_day="2020-01-31")).rows) == []
        for first, last in (("2026-13-01", ""), ("yesterday", ""), ("2026-05-02", "2026-05-01")):
            with pytest.raises(InvalidRequest):
                await alice.get_spend(first_day=first, last_day=last)
        with pytest.raises(InvalidRequest):
            await alice.get_spend(first_day="2024-01-01", last_day="2025-12-31")


async def test_two_replicas_on_one_redis_share_the_quotas_and_the_ledger(
    tmp_path: Path, provider: LoopbackProvider, postgres_dsn: str, redis_url: str
) -> None:
    settings: dict[str, Any] = {
        "auth_api_keys": KEYS,
        "tenant_quotas": {"acme": QuotaSettings(concurrent_runs=1, requests_per_minute=3)},
        "run_bus": "redis",
        "redis_url": redis_url,
        "chat_store": "postgres",
        "run_log": "postgres",
        "postgres_dsn": postgres_dsn,
        "http_enabled": False,
    }
    directory = agents(tmp_path)
    gate = asyncio.Event()
    provider.enqueue([content("so far"), Gate(gate), finish("stop"), DONE])
    async with (
        Harness.start(directory, provider, data_dir=tmp_path / "a", **settings) as a,
        Harness.start(directory, provider, data_dir=tmp_path / "b", **settings) as b,
        client(a, "alice") as on_a,
        client(b, "alice") as on_b,
    ):
        stream = on_a.query("plain", "Slow")
        async for event in stream:
            if event.type == "content.delta":
                break
        with pytest.raises(QuotaExceeded) as busy:  # the run on A holds acme's one slot
            await on_b.ask("plain", "On B")
        assert busy.value.metadata["quota"] == "concurrent_runs"
        gate.set()
        assert (await stream.result()).outcome == "complete"
        await asyncio.sleep(0.05)
        provider.enqueue(answer())
        assert (await on_b.ask("plain", "On B")).outcome == "complete"  # the slot is back
        with pytest.raises(QuotaExceeded) as rate:  # 4 queries this minute on A and B
            await on_a.ask("plain", "Again")
        assert rate.value.metadata["quota"] == "requests_per_minute"
        for replica in (a, b):
            await replica.app.frontdoor.quotas.flush()  # type: ignore[union-attr]
        rows = (await on_a.get_spend()).rows  # both replicas' runs in PostgreSQL
        assert [(r.api_key, r.agent_key, r.calls) for r in rows] == [("alice", "plain", 2)]
