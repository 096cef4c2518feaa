"""A2A push notifications, with the official client (a2a-sdk) and in A2A 0.3's JSON-RPC: a
task's push configurations are set, read, listed and deleted, and the service POSTs the
task's status to them at each change of state, as the A2A spec's push notifications."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from a2a.compat.v0_3.types import Task as TaskV03
from a2a.types import a2a_pb2 as a2a
from google.protobuf import json_format

from service.providers.loopback import LoopbackProvider
from tests.core.tools.kit import answer_turn, call_turn
from tests.gateway.a2a_kit import A2AService, a2a_service, collect, data, text, user_message
from tests.gateway.test_a2a_protocol import STREAM_V03
from tests.notify.kit import Receiver, receiver


@pytest.fixture
async def hook() -> AsyncIterator[Receiver]:
    async with receiver() as got:
        yield got


@pytest.fixture
async def service(tmp_path: Path, provider: LoopbackProvider) -> AsyncIterator[A2AService]:
    async with a2a_service(
        tmp_path, provider, webhook_allowed_hosts=["127.0.0.1"], webhook_retry_s=0.2
    ) as running:
        yield running


def states(pushes: list[Any]) -> list[str]:
    """The task states the pushes say (1.0: a StreamResponse's status update)."""
    out = []
    for push in pushes:
        response = json_format.ParseDict(push.json, a2a.StreamResponse())
        out.append(a2a.TaskState.Name(response.status_update.status.state))
    return out


async def test_a_tasks_push_configuration_is_kept_and_told_each_change(
    service: A2AService, hook: Receiver
) -> None:
    service.provider.enqueue(
        call_turn(("call_f", "pick", '{"options":["a","b"]}')), answer_turn("a it is")
    )
    client = await service.client("ui")
    asked = await collect(client.send_message(user_message(text("Choose"))))
    task = asked[0].task
    config = a2a.TaskPushNotificationConfig(
        task_id=task.id,
        url=hook.url + "/push",
        token="tok-1",
        authentication=a2a.AuthenticationInfo(scheme="Bearer", credentials="cred-1"),
    )
    created = await client.create_task_push_notification_config(config)
    got = await client.get_task_push_notification_config(
        a2a.GetTaskPushNotificationConfigRequest(task_id=task.id, id=created.id)
    )
    listed = await client.list_task_push_notification_configs(
        a2a.ListTaskPushNotificationConfigsRequest(task_id=task.id)
    )
    answer = user_message(data({"choice": "a"}), task_id=task.id, message_id="ans-1")
    await collect(client.send_message(answer))
    pushes = await hook.wait_for(2)
    await client.delete_task_push_notification_config(
        a2a.DeleteTaskPushNotificationConfigRequest(task_id=task.id, id=created.id)
    )
    after = await client.list_task_push_notification_configs(
        a2a.ListTaskPushNotificationConfigsRequest(task_id=task.id)
    )
    assert created.id.startswith("wh_") and created.task_id == task.id
    assert (created.url, created.token) == (hook.url + "/push", "tok-1")
    assert not created.HasField("authentication")  # the credentials are never shown again
    assert got == created and list(listed.configs) == [created]
    # the answer set the task working again, then it completed: a push each
    assert states(pushes) == ["TASK_STATE_WORKING", "TASK_STATE_COMPLETED"]
    working, completed = (p.json["statusUpdate"] for p in pushes)
    assert (working["taskId"], working["contextId"]) == (task.id, task.context_id)
    assert working["metadata"] == {"agwType": "request.submit"}
    assert completed["metadata"]["finishReason"] == "stop"
    for push in pushes:
        assert push.path == "/push"
        assert push.headers["X-A2A-Notification-Token"] == "tok-1"
        assert push.headers["Authorization"] == "Bearer cred-1"
    assert list(after.configs) == []


async def test_a_push_configuration_given_with_the_message_hears_the_whole_task(
    service: A2AService, hook: Receiver
) -> None:
    service.provider.enqueue(answer_turn("Hi there"))
    client = await service.client("plain")
    request = user_message(text("Hi"))
    request.configuration.task_push_notification_config.url = hook.url
    responses = await collect(client.send_message(request))
    pushes = await hook.wait_for(2)
    assert states(pushes) == ["TASK_STATE_WORKING", "TASK_STATE_COMPLETED"]
    assert {p.json["statusUpdate"]["taskId"] for p in pushes} == {responses[0].task.id}


async def test_push_configurations_in_a2a_0_3(service: A2AService, hook: Receiver) -> None:
    service.provider.enqueue(answer_turn("Hi there"))
    configuration = {"pushNotificationConfig": {"url": hook.url, "token": "t"}}
    params = {**STREAM_V03["params"], "configuration": configuration}
    sent = await service.rpc("plain", {**STREAM_V03, "method": "message/send", "params": params})
    task_id = sent.json()["result"]["id"]
    pushes = await hook.wait_for(2)

    async def call(method: str, params: dict[str, Any]) -> Any:
        body = {"jsonrpc": "2.0", "id": 2, "method": f"tasks/pushNotificationConfig/{method}"}
        return (await service.rpc("plain", {**body, "params": params})).json()

    set_ = await call(
        "set", {"taskId": task_id, "pushNotificationConfig": {"id": "p2", "url": hook.url + "/b"}}
    )
    first = await call("get", {"id": task_id})
    second = await call("get", {"id": task_id, "pushNotificationConfigId": "p2"})
    listed = await call("list", {"id": task_id})
    deleted = await call("delete", {"id": task_id, "pushNotificationConfigId": "p2"})
    missing = await call("get", {"id": task_id, "pushNotificationConfigId": "p2"})
    elsewhere = await call(
        "set", {"taskId": task_id, "pushNotificationConfig": {"url": "http://10.0.0.1/x"}}
    )
    tasks = [TaskV03.model_validate(p.json) for p in pushes]
    assert [(t.id, t.status.state.value) for t in tasks] == [
        (task_id, "working"),
        (task_id, "completed"),
    ]
    assert pushes[0].headers["X-A2A-Notification-Token"] == "t"
    config = {"taskId": task_id, "pushNotificationConfig": {"id": "p2", "url": hook.url + "/b"}}
    assert set_["result"] == config and second["result"] == config
    assert first["result"]["pushNotificationConfig"]["url"] == hook.url
    assert [c["pushNotificationConfig"]["url"] for c in listed["result"]] == [
        hook.url,
        hook.url + "/b",
    ]
    assert deleted["result"] is None
    assert missing["error"]["code"] == -32602
    assert elsewhere["error"]["code"] == -32602
    assert "webhook_allowed_hosts" in elsewhere["error"]["message"]
