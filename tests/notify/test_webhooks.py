"""Webhooks: a run's end is POSTed, signed, to the webhooks of its query, its agent and the
service; refused deliveries are retried with a doubling back-off, and still sent after the
service restarts; a run's webhooks are managed over gRPC and HTTP by the run's owner."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from agw.v1 import gateway_pb2 as gw

from service.providers.loopback import LoopbackProvider
from service.testing import Harness, write_agent
from tests.core.tools.kit import agent, answer_turn
from tests.notify.kit import Receiver, receiver

SECRET = "hook-secret-1"
SERVICE_SECRET = "service-secret"
KEYS = [{"key": "key-a", "subject": "a"}, {"key": "key-b", "subject": "b"}]
ALICE = (("authorization", "Bearer key-a"),)
BOB = (("authorization", "Bearer key-b"),)


@pytest.fixture
async def hook() -> AsyncIterator[Receiver]:
    async with receiver() as got:
        yield got


def settings(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {
        "webhook_allowed_hosts": ["127.0.0.1"],
        "webhook_retry_s": 0.2,
        "data_dir": tmp_path / "data",
        **extra,
    }


def agents(tmp_path: Path, **extra: Any) -> Path:
    directory = tmp_path / "agents"
    write_agent(directory, "plain", agent(**extra))
    return directory


async def start(service: Harness, url: str, metadata: Any = (), **webhook: Any) -> str:
    query = gw.QueryRequest(
        agent_key="plain", message="Hi", webhooks=[gw.Webhook(url=url, **webhook)]
    )
    started = await service.stub.Start(gw.StartRequest(query=query), metadata=metadata)
    return started.run_id


async def test_a_runs_end_is_posted_signed_to_its_querys_webhook(
    tmp_path: Path, provider: LoopbackProvider, hook: Receiver
) -> None:
    provider.enqueue(answer_turn("Done."))
    async with Harness.start(agents(tmp_path), provider, **settings(tmp_path)) as service:
        run_id = await start(service, hook.url + "/done", secret=SECRET)
        [got] = await hook.wait_for(1)
        waited = await service.stub.Wait(gw.WaitRequest(run_id=run_id, timeout_ms=5000))
    body = got.json
    assert got.path == "/done"
    assert got.headers["Content-Type"] == "application/json"
    assert got.headers["Webhook-Id"] == body["id"] and body["id"].startswith("whd_")
    assert got.signed_with(SECRET.encode()) and not got.signed_with(b"other")
    terminal = waited.terminal
    assert body == {
        "id": body["id"],
        "type": "run.complete",
        "runId": run_id,
        "chatId": terminal.chat_id,
        "agentKey": "plain",
        "state": "completed",
        "event": {
            "seq": terminal.seq,
            "type": "run.complete",
            "timestamp": terminal.timestamp,
            "chatId": terminal.chat_id,
            "runId": run_id,
            "finishReason": "stop",
            "usage": {"promptTokens": 10, "completionTokens": 5, "totalTokens": 15},
        },
        "timestamp": terminal.timestamp,
    }
    await asyncio.sleep(0.3)
    assert len(hook.received) == 1  # taken: not sent again


async def test_a_refused_notification_is_retried_with_a_doubling_back_off(
    tmp_path: Path, provider: LoopbackProvider, hook: Receiver
) -> None:
    hook.statuses = [500, 503]
    provider.enqueue(answer_turn("Done."))
    async with Harness.start(agents(tmp_path), provider, **settings(tmp_path)) as service:
        await start(service, hook.url, secret=SECRET)
        attempts = await hook.wait_for(3)
        await asyncio.sleep(0.5)
    assert len(hook.received) == 3
    assert len({a.headers["Webhook-Id"] for a in attempts}) == 1
    assert len({a.body for a in attempts}) == 1  # the same notification each time
    first, second = attempts[1].at - attempts[0].at, attempts[2].at - attempts[1].at
    assert 0.2 <= first < second and second >= 0.4


async def test_a_notification_not_yet_delivered_is_sent_after_a_restart(
    tmp_path: Path, provider: LoopbackProvider, hook: Receiver
) -> None:
    hook.statuses = [500] * 100
    provider.enqueue(answer_turn("Done."))
    slow = settings(tmp_path, webhook_retry_s=30.0)  # the next attempt would be far off
    async with Harness.start(agents(tmp_path), provider, **slow) as service:
        await start(service, hook.url, secret=SECRET)
        [refused] = await hook.wait_for(1)
    hook.statuses = []
    async with Harness.start(agents(tmp_path), provider, **settings(tmp_path)) as service:
        # kept in data/runs/webhooks.sqlite3: due again once its back-off (30 s) has passed,
        # which the test does not wait for: it asks the queue when it is due, then moves it
        store = service.app.webhooks
        [queued] = await store.due(10**15, 10, 0)
        assert queued.delivery_id == refused.headers["Webhook-Id"]
        await store.retry(queued.delivery_id, queued.attempts, 0)
        service.app.webhook_sender.wake()
        _, delivered = await hook.wait_for(2)
    assert delivered.headers["Webhook-Id"] == refused.headers["Webhook-Id"]
    assert delivered.body == refused.body


async def test_the_services_and_the_agents_webhooks_hear_of_every_run(
    tmp_path: Path, provider: LoopbackProvider, hook: Receiver
) -> None:
    provider.enqueue(answer_turn("One."), answer_turn("Two."))
    directory = agents(tmp_path, webhooks=[hook.url + "/agent"])
    options = settings(
        tmp_path, webhook_urls=[hook.url + "/service"], webhook_secret=SERVICE_SECRET
    )
    async with Harness.start(directory, provider, **options) as service:
        first = await service.query("plain", "Hi")
        second = await service.query("plain", "Again")
        got = await hook.wait_for(4)
    by_run: dict[str, set[str]] = {}
    for request in got:
        assert request.signed_with(SERVICE_SECRET.encode())
        by_run.setdefault(request.json["runId"], set()).add(request.path)
    assert by_run == {
        first[0].run_id: {"/agent", "/service"},
        second[0].run_id: {"/agent", "/service"},
    }


@pytest.mark.parametrize(
    ("webhook", "message"),
    [
        (
            {"url": "http://10.1.2.3/hook", "secret": SECRET},
            "webhooks[0].url: host '10.1.2.3' is not one the service may call (the setting "
            "webhook_allowed_hosts lists them)",
        ),
        (
            {"url": "ftp://127.0.0.1/hook", "secret": SECRET},
            "webhooks[0].url: must be an http or https URL",
        ),
        (
            {"url": "http://user:pw@127.0.0.1/hook", "secret": SECRET},
            "webhooks[0].url: may not carry credentials (use authorization)",
        ),
        (
            {"url": "http://127.0.0.1/hook"},
            "webhooks[0]: give it a secret (the service has no webhook_secret to sign with)",
        ),
    ],
)
async def test_a_webhook_the_service_may_not_call_refuses_the_query(
    tmp_path: Path, provider: LoopbackProvider, webhook: dict[str, str], message: str
) -> None:
    async with Harness.start(agents(tmp_path), provider, **settings(tmp_path)) as service:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await start(service, **webhook)
        assert service.app.frontdoor.runs == {}
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == message
    assert provider.requests == []


async def test_a_runs_webhooks_are_managed_by_its_owner_over_http(
    tmp_path: Path, provider: LoopbackProvider, hook: Receiver
) -> None:
    provider.enqueue(answer_turn("Done."))
    options = settings(tmp_path, auth_api_keys=KEYS, webhook_secret=SERVICE_SECRET)
    async with Harness.start(agents(tmp_path), provider, **options) as service:
        run_id = await start(service, hook.url + "/first", ALICE)
        base = f"{service.http_url}/api/runs/{run_id}/webhooks"
        alice, bob = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
        async with httpx.AsyncClient(timeout=20) as http:
            added = await http.post(
                base,
                headers=alice,
                json={"url": hook.url + "/second", "secret": "s", "authorization": "Bearer x"},
            )
            hook_id = added.json()["data"]["webhookId"]
            listed = await http.get(base, headers=alice)
            got = await http.get(f"{base}/{hook_id}", headers=alice)
            theirs = await http.get(base, headers=bob)
            removed = await http.delete(f"{base}/{hook_id}", headers=alice)
            again = await http.delete(f"{base}/{hook_id}", headers=alice)
            after = await http.get(base, headers=alice)
    assert added.status_code == 200
    shown = added.json()["data"]
    assert shown == {
        "webhookId": hook_id,
        "runId": run_id,
        "url": hook.url + "/second",
        "format": "WEBHOOK_FORMAT_AGW",
        "authorized": True,
        "createdAt": shown["createdAt"],
    }  # never the secret, never the authorization
    assert [w["url"] for w in listed.json()["data"]["webhooks"]] == [
        hook.url + "/first",
        hook.url + "/second",
    ]
    assert got.json()["data"] == shown
    assert (theirs.status_code, theirs.json()["reason"]) == (404, "RUN_NOT_FOUND")
    assert (removed.status_code, removed.json()["data"]) == (200, {})
    assert (again.status_code, again.json()["reason"]) == (404, "NOT_FOUND")
    assert [w["url"] for w in after.json()["data"]["webhooks"]] == [hook.url + "/first"]


async def test_a_notification_is_dropped_after_its_last_attempt(
    tmp_path: Path, provider: LoopbackProvider, hook: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    hook.statuses = [500] * 10
    provider.enqueue(answer_turn("Done."))
    options = settings(tmp_path, webhook_max_attempts=2, webhook_retry_s=0.1)
    async with Harness.start(agents(tmp_path), provider, **options) as service:
        run_id = await start(service, hook.url, secret=SECRET)
        await hook.wait_for(2)
        await asyncio.sleep(0.5)
        left = await service.app.webhooks.next_due()
    assert len(hook.received) == 2 and left is None
    assert f"gave up notifying {hook.url} of run {run_id} after 2 attempts (HTTP 500)" in (
        caplog.text
    )
