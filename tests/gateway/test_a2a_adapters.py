"""A2A tasks through another adapter process, or another replica: nothing is kept between calls.

A task's first message goes through one HTTP adapter; `tasks/get` and the
follow-up answering its wait go through another one (its own gRPC channel, as
another process has), in front of the same service or of another replica on
one Redis.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.client.client import Client
from a2a.types import a2a_pb2 as a2a

from service.builtins.ask_user import ask_user_tool
from service.providers.loopback import LoopbackProvider
from tests.bus.conftest import started
from tests.core.tools.kit import agent, answer_turn, call_turn, tools
from tests.gateway.a2a_kit import A2AService, a2a_service, as_dict, brief, collect, text
from tests.gateway.a2a_kit import user_message as message
from tests.gateway.test_agui_adapters import adapter

QUESTION = {"question": "Which city?", "options": ["Oslo", "Rome"]}
ASK = call_turn(("q1", "ask_user", json.dumps(QUESTION)))
ASKER = agent(toolConfig=tools("ask_user"))
ASKED = [
    ("task", "submitted"),
    ("status", "submitted", "chat.start"),
    ("status", "working"),
    ("status", "working", "tool.start"),
    ("status", "working", "tool.args"),
    ("status", "working", "tool.args"),
    ("status", "working", "tool.end"),
    ("status", "input_required", "Which city?\n- Oslo\n- Rome"),
]
ANSWERED = [
    ("task", "working"),
    ("status", "working", "request.submit"),
    ("status", "working", "question.answer"),
    ("status", "working", "tool.result"),
    ("artifact", "Rome it is.", False, False),
    ("artifact", "Rome it is.", False, True),
    ("status", "completed"),
]


async def client_of(http: httpx.AsyncClient, url: str) -> Client:
    """The official client of the A2A agent at `url` (A2A 1.0)."""
    card = await A2ACardResolver(http, url).get_agent_card()
    interfaces = [i for i in card.supported_interfaces if i.protocol_version == "1.0"]
    del card.supported_interfaces[:]
    card.supported_interfaces.extend(interfaces)
    return ClientFactory(ClientConfig(httpx_client=http)).create(card)


async def ask_on_a_answer_on_b(first: Client, second: Client) -> None:
    """The question is asked through `first`; the task is read and answered through `second`."""
    asked = await collect(first.send_message(message(text("Weather?"))))
    assert [brief(r) for r in asked] == ASKED
    task_id = asked[0].task.id
    question = asked[-1].status_update.status.message
    waiting = await second.get_task(a2a.GetTaskRequest(id=task_id))
    assert waiting.status.state == a2a.TaskState.TASK_STATE_INPUT_REQUIRED
    assert as_dict(waiting.status.message) == as_dict(question)
    wait = as_dict(question.parts[1].data)
    assert (wait["waitType"], wait["question"]) == ("question", "Which city?")
    answer = message(text("Rome"), task_id=task_id, message_id="ans-1")
    answered = await collect(second.send_message(answer))
    assert [brief(r) for r in answered] == ANSWERED
    done = await first.get_task(a2a.GetTaskRequest(id=task_id))
    assert done.status.state == a2a.TaskState.TASK_STATE_COMPLETED


async def test_a_question_is_read_and_answered_through_another_adapter(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(ASK, answer_turn("Rome it is."))
    async with a2a_service(tmp_path, provider) as service:
        await _across(service)
    assert provider.requests[1]["messages"][-1]["content"] == "Rome"


async def _across(service: A2AService) -> None:
    async with adapter(service.harness.app.grpc.port) as other:
        first = await service.client("asker")
        second = await client_of(service.http, f"{str(other.base_url).rstrip('/')}/a2a/asker")
        await ask_on_a_answer_on_b(first, second)


async def test_a_question_on_one_replica_is_read_and_answered_through_another(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    provider.enqueue(ASK, answer_turn("Rome it is."))
    async with (
        started(tmp_path, provider, redis_url, ("A", "B"), agents={"asker": ASKER}) as replicas,
        adapter(replicas["A"].port) as a,
        adapter(replicas["B"].port) as b,
        httpx.AsyncClient(timeout=20.0) as http,
    ):
        for replica in (replicas["A"], replicas["B"]):
            replica.front.services.tools.register(ask_user_tool(60.0))
        first = await client_of(http, f"{str(a.base_url).rstrip('/')}/a2a/asker")
        second = await client_of(http, f"{str(b.base_url).rstrip('/')}/a2a/asker")
        await ask_on_a_answer_on_b(first, second)
