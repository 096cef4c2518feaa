"""Webhooks across replicas sharing PostgreSQL and Redis: a webhook added through one
replica hears of a run another executes, and each notification is sent once."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agw.v1 import gateway_pb2 as gw
from google.protobuf import struct_pb2

from service.providers.loopback import LoopbackProvider
from service.testing import Harness, write_agent
from tests.core.tools.kit import agent, answer_turn, call_turn, tools, write_ui_tools
from tests.notify.kit import receiver


async def test_a_webhook_added_on_b_hears_of_a_run_on_a_once(
    tmp_path: Path, provider: LoopbackProvider, postgres_dsn: str, redis_url: str
) -> None:
    agents = tmp_path / "agents"
    write_agent(agents, "ui", agent(toolConfig=tools(frontends=("pick",))))
    shared = {
        "tools_dir": write_ui_tools(tmp_path / "tools"),
        "run_bus": "redis",
        "redis_url": redis_url,
        "chat_store": "postgres",
        "run_log": "postgres",
        "postgres_dsn": postgres_dsn,
        "webhook_allowed_hosts": ["127.0.0.1"],
        "http_enabled": False,
    }
    provider.enqueue(call_turn(("f1", "pick", '{"options": ["a"]}')), answer_turn("Picked."))
    async with (
        receiver() as hook,
        Harness.start(agents, provider, data_dir=tmp_path / "a", **shared) as a,
        Harness.start(agents, provider, data_dir=tmp_path / "b", **shared) as b,
    ):
        assert a.app.settings.webhook_store_name == "postgres"
        started = await a.stub.Start(
            gw.StartRequest(query=gw.QueryRequest(agent_key="ui", message="Pick"))
        )
        waiting = await b.stub.Wait(gw.WaitRequest(run_id=started.run_id, timeout_ms=5000))
        added = await b.stub.CreateRunWebhook(
            gw.CreateRunWebhookRequest(
                run_id=started.run_id,
                webhook=gw.Webhook(url=hook.url, format=gw.WEBHOOK_FORMAT_A2A),
            )
        )
        reply = await b.stub.Submit(
            gw.SubmitRequest(
                run_id=started.run_id,
                tool_id=waiting.waits[0].tool_id,
                payload=struct_pb2.Value(string_value="a"),
            )
        )
        pushes = await hook.wait_for(2)
        await asyncio.sleep(0.5)
        listed = await a.stub.ListRunWebhooks(gw.ListRunWebhooksRequest(run_id=started.run_id))
    assert waiting.status == gw.RUN_STATUS_WAITING and reply.accepted
    assert [w.webhook_id for w in listed.webhooks] == [added.webhook_id]
    # the owner (A) read the webhook B added at each change of the run's state
    assert [p.json["statusUpdate"]["status"]["state"] for p in pushes] == [
        "TASK_STATE_WORKING",
        "TASK_STATE_COMPLETED",
    ]
    assert len(hook.received) == 2  # each sent once, whichever replica took it
