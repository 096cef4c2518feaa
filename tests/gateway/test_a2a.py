"""The A2A endpoint, end to end: the official `a2a-sdk` client over HTTP to the adapter.

The service runs whole on loopback with a fake model; each test states the exact
sequence of stream responses the client sees (see `brief`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.client.errors import AgentCardResolutionError
from a2a.types import a2a_pb2 as a2a
from a2a.utils.errors import InvalidParamsError, TaskNotCancelableError, TaskNotFoundError

from service.providers import loopback as lb
from service.providers.loopback import LoopbackProvider
from tests.core.tools.kit import answer_turn, call_turn
from tests.gateway.a2a_kit import (
    A2AService,
    a2a_service,
    as_dict,
    brief,
    collect,
    data,
    text,
    user_message,
)

ONESHOT = [
    ("task", "submitted"),
    ("status", "submitted", "chat.start"),
    ("status", "working"),
    ("status", "working", "reasoning.start"),
    ("status", "working", "reasoning.delta"),
    ("status", "working", "reasoning.end"),
    ("artifact", "Hel", False, False),
    ("artifact", "lo", True, False),
    ("artifact", "Hello", False, True),
    ("status", "completed"),
]


@pytest.fixture
async def service(tmp_path: Path, provider: LoopbackProvider) -> A2AService:
    async with a2a_service(tmp_path, provider) as running:
        yield running


# The card ----------------------------------------------------------------------------


async def test_each_agent_has_a_card_the_client_resolves(service: A2AService) -> None:
    card = await service.card("thinker")
    url = service.url("thinker")
    assert (card.name, card.description) == ("Thinker", "Thinks, then calls tools.")
    assert card.capabilities.streaming and card.capabilities.push_notifications
    assert [(i.url, i.protocol_binding, i.protocol_version) for i in card.supported_interfaces] == [
        (url, "JSONRPC", "1.0"),
        (url, "JSONRPC", "0.3"),
    ]
    assert [as_dict(s) for s in card.skills] == [
        {
            "id": "thinker",
            "name": "Thinker",
            "description": "Thinks, then calls tools.",
            "tags": ["react", "echo"],
        }
    ]


async def test_the_card_names_the_host_and_scheme_the_request_used(service: A2AService) -> None:
    port = service.harness.app.http.port
    response = await service.http.get(
        f"{service.url('plain')}/.well-known/agent-card.json", headers={"Host": f"localhost:{port}"}
    )
    body = response.json()
    assert body["url"] == f"http://localhost:{port}/a2a/plain"
    assert {i["url"] for i in body["supportedInterfaces"]} == {body["url"]}
    assert (body["protocolVersion"], body["preferredTransport"]) == ("0.3.0", "JSONRPC")


async def test_an_unknown_agent_has_no_card_and_no_endpoint(service: A2AService) -> None:
    with pytest.raises(AgentCardResolutionError) as missing:
        await service.card("nope")
    assert missing.value.status_code == 404
    card = await service.card("plain")
    card.supported_interfaces[0].url = service.url("nope")
    del card.supported_interfaces[1:]
    client = ClientFactory(ClientConfig(httpx_client=service.http)).create(card)
    with pytest.raises(InvalidParamsError) as refused:
        await collect(client.send_message(user_message(text("Hi"))))
    assert "unknown agent 'nope'" in refused.value.message
    assert refused.value.data == {"agent_key": "nope", "status": "NOT_FOUND"}


# Streaming ---------------------------------------------------------------------------


async def test_a_oneshot_answer_streams_as_artifact_deltas(service: A2AService) -> None:
    service.provider.enqueue(answer_turn("Hel", "lo", reasoning="Hm"))
    client = await service.client("plain")
    responses = await collect(client.send_message(user_message(text("Hi"), message_id="q-1")))
    assert [brief(r) for r in responses] == ONESHOT
    task = responses[0].task
    assert task.id and task.context_id
    assert [as_dict(m) for m in task.history] == [
        {
            "messageId": "q-1",
            "role": "ROLE_USER",
            "parts": [{"text": "Hi"}],
            "contextId": task.context_id,
            "taskId": task.id,
        }
    ]
    assert {(r.status_update.task_id, r.status_update.context_id) for r in responses[1:6]} == {
        (task.id, task.context_id)
    }
    delta = responses[4].status_update.status.message
    assert as_dict(delta.parts[0].data)["delta"] == "Hm"
    assert {r.artifact_update.artifact.artifact_id for r in responses[6:9]} == {f"{task.id}_c_1"}
    assert as_dict(responses[9].status_update.metadata)["finishReason"] == "stop"
    assert service.provider.requests[0]["messages"][-1]["content"] == "Hi"

    got = await client.get_task(a2a.GetTaskRequest(id=task.id))
    assert got.status.state == a2a.TaskState.TASK_STATE_COMPLETED
    assert [as_dict(a) for a in got.artifacts] == [
        {"artifactId": f"{task.id}_c_1", "name": "answer", "parts": [{"text": "Hello"}]}
    ]
    assert [m.message_id for m in got.history] == ["q-1"]


async def test_a_context_continues_its_chat(service: A2AService) -> None:
    service.provider.enqueue(answer_turn("One"), answer_turn("Two"))
    client = await service.client("plain")
    first = await collect(client.send_message(user_message(text("1"))))
    context_id = first[0].task.context_id
    second = await collect(client.send_message(user_message(text("2"), context_id=context_id)))
    assert second[0].task.context_id == context_id
    assert second[0].task.id != first[0].task.id
    assert [brief(r) for r in second][-2:] == [
        ("artifact", "Two", False, True),
        ("status", "completed"),
    ]
    assert [m["content"] for m in service.provider.requests[1]["messages"][1:]] == ["1", "One", "2"]


async def test_react_tool_calls_stream_as_details(service: A2AService) -> None:
    service.provider.enqueue(
        call_turn(("call_1", "echo", '{"text":"hi"}'), reasoning="Echo it"),
        answer_turn("Echoed: hi"),
    )
    client = await service.client("thinker")
    responses = await collect(client.send_message(user_message(text("Echo hi"))))
    assert [brief(r) for r in responses] == [
        ("task", "submitted"),
        ("status", "submitted", "chat.start"),
        ("status", "working"),
        ("status", "working", "reasoning.start"),
        ("status", "working", "reasoning.delta"),
        ("status", "working", "reasoning.end"),
        ("status", "working", "tool.start"),
        ("status", "working", "tool.args"),
        ("status", "working", "tool.args"),
        ("status", "working", "tool.end"),
        ("status", "working", "tool.result"),
        ("artifact", "Echoed: hi", False, False),
        ("artifact", "Echoed: hi", False, True),
        ("status", "completed"),
    ]
    start = as_dict(responses[6].status_update.status.message.parts[0].data)
    assert (start["toolId"], start["toolName"], start["toolType"]) == ("call_1", "echo", "backend")
    result = as_dict(responses[10].status_update.status.message.parts[0].data)
    assert result["result"] == {"echo": "hi", "taskId": ""}
    assert service.probe.calls == [("echo", {"text": "hi"})]


# Waiting for the user ------------------------------------------------------------------


async def test_a_frontend_tool_asks_for_input_and_a_follow_up_answers_it(
    service: A2AService,
) -> None:
    service.provider.enqueue(
        call_turn(("call_f", "pick", '{"options":["a","b"]}')), answer_turn("a it is")
    )
    client = await service.client("ui")
    asked = await collect(client.send_message(user_message(text("Choose"))))
    assert [brief(r) for r in asked] == [
        ("task", "submitted"),
        ("status", "submitted", "chat.start"),
        ("status", "working"),
        ("status", "working", "tool.start"),
        ("status", "working", "tool.args"),
        ("status", "working", "tool.args"),
        ("status", "input_required", "pick waits for your answer"),
    ]
    task_id, context_id = asked[0].task.id, asked[0].task.context_id
    question = asked[-1].status_update.status.message
    tool_id = as_dict(asked[3].status_update.status.message.parts[0].data)["toolId"]
    assert as_dict(question.parts[1].data) == {
        "waitId": tool_id,
        "waitType": "tool",
        "toolName": "pick",
        "toolType": "html",
        "arguments": {"options": ["a", "b"]},
        "description": "Let the user pick an option.",
    }
    waiting = await client.get_task(a2a.GetTaskRequest(id=task_id))
    # A live run's task is folded from its events so far: it waits for the pick.
    assert waiting.status.state == a2a.TaskState.TASK_STATE_INPUT_REQUIRED
    assert as_dict(waiting.status.message) == as_dict(question)
    assert [m.message_id for m in waiting.history] == ["m-1"]

    answer = user_message(data({"choice": "a"}), task_id=task_id, message_id="ans-1")
    answered = await collect(client.send_message(answer))
    assert [brief(r) for r in answered] == [
        ("task", "working"),
        ("status", "working", "request.submit"),
        ("status", "working", "tool.result"),
        ("artifact", "a it is", False, False),
        ("artifact", "a it is", False, True),
        ("status", "completed"),
    ]
    assert answered[0].task.context_id == context_id
    assert service.provider.requests[1]["messages"][-1]["content"] == '{"choice": "a"}'
    done = await client.get_task(a2a.GetTaskRequest(id=task_id))
    assert [as_dict(m)["parts"] for m in done.history] == [
        [{"text": "Choose"}],
        [{"data": {"choice": "a"}}],
    ]

    with pytest.raises(InvalidParamsError) as again:
        await collect(client.send_message(user_message(text("b"), task_id=task_id)))
    assert "is in a terminal state" in again.value.message


async def test_a_question_asks_for_input_and_a_text_answers_it(service: A2AService) -> None:
    arguments = '{"question": "Which city?", "options": ["Oslo", "Rome"]}'
    service.provider.enqueue(call_turn(("call_q", "ask_user", arguments)), answer_turn("Rome."))
    client = await service.client("asker")
    asked = await collect(client.send_message(user_message(text("Plan a trip"))))
    assert [brief(r) for r in asked][-2:] == [
        ("status", "working", "tool.end"),
        ("status", "input_required", "Which city?\n- Oslo\n- Rome"),
    ]
    wait = as_dict(asked[-1].status_update.status.message.parts[1].data)
    assert wait == {
        "waitId": wait["waitId"],
        "waitType": "question",
        "question": "Which city?",
        "options": ["Oslo", "Rome"],
    }
    assert wait["waitId"].startswith("q_")
    with pytest.raises(InvalidParamsError) as empty:
        await collect(client.send_message(user_message(text(""), task_id=asked[0].task.id)))
    assert "no text and no data" in empty.value.message
    answer = user_message(text("Rome"), task_id=asked[0].task.id)
    answer.message.metadata.update({"waitId": wait["waitId"]})
    answered = await collect(client.send_message(answer))
    assert [brief(r) for r in answered] == [
        ("task", "working"),
        ("status", "working", "request.submit"),
        ("status", "working", "question.answer"),
        ("status", "working", "tool.result"),
        ("artifact", "Rome.", False, False),
        ("artifact", "Rome.", False, True),
        ("status", "completed"),
    ]
    assert as_dict(answered[2].status_update.status.message.parts[0].data)["answer"] == "Rome"


async def test_a_non_streaming_send_returns_the_folded_task(service: A2AService) -> None:
    service.provider.enqueue(
        call_turn(("call_f", "pick", '{"question":"Which one?","options":["a","b"]}')),
        answer_turn("b", " then"),
    )
    client = await service.client("ui", streaming=False)
    [asked] = await collect(client.send_message(user_message(text("Choose"))))
    task = asked.task
    assert task.status.state == a2a.TaskState.TASK_STATE_INPUT_REQUIRED
    assert task.status.message.parts[0].text == "Which one?"
    [done] = await collect(client.send_message(user_message(text("b"), task_id=task.id)))
    assert done.task.status.state == a2a.TaskState.TASK_STATE_COMPLETED
    assert [a.parts[0].text for a in done.task.artifacts] == ["b then"]
    assert service.provider.requests[1]["messages"][-1]["content"] == "b"


# Cancel and failure --------------------------------------------------------------------


async def test_cancel_task_ends_the_stream_canceled(service: A2AService) -> None:
    service.provider.enqueue(call_turn(("call_s", "forever", "{}")))
    client = await service.client("slow")
    responses: list[a2a.StreamResponse] = []
    called = asyncio.Event()

    async def read() -> None:
        async for response in client.send_message(user_message(text("Wait"))):
            responses.append(response)
            if brief(response) == ("status", "working", "tool.end"):
                called.set()

    reader = asyncio.create_task(read())
    await asyncio.wait_for(called.wait(), 10)
    await asyncio.wait_for(service.probe.started.wait(), 10)
    task_id = responses[0].task.id
    cancelled = await client.cancel_task(a2a.CancelTaskRequest(id=task_id))
    await asyncio.wait_for(reader, 10)
    assert cancelled.status.state == a2a.TaskState.TASK_STATE_CANCELED
    assert [brief(r) for r in responses] == [
        ("task", "submitted"),
        ("status", "submitted", "chat.start"),
        ("status", "working"),
        ("status", "working", "tool.start"),
        ("status", "working", "tool.args"),
        ("status", "working", "tool.args"),
        ("status", "working", "tool.end"),
        ("status", "canceled"),
    ]
    assert as_dict(responses[-1].status_update.metadata) == {"reason": "cancel"}
    assert service.probe.cancelled.is_set()
    with pytest.raises(TaskNotCancelableError):
        await client.cancel_task(a2a.CancelTaskRequest(id=task_id))
    with pytest.raises(TaskNotFoundError):
        await client.cancel_task(a2a.CancelTaskRequest(id="nope"))
    with pytest.raises(TaskNotFoundError):
        await client.get_task(a2a.GetTaskRequest(id="nope"))


async def test_a_run_error_fails_the_task(service: A2AService) -> None:
    service.provider.enqueue([lb.HttpError(500, {"error": {"message": "model down"}})])
    client = await service.client("plain")
    responses = await collect(client.send_message(user_message(text("Hi"))))
    assert [brief(r)[:2] for r in responses] == [
        ("task", "submitted"),
        ("status", "submitted"),
        ("status", "working"),
        ("status", "failed"),
    ]
    failed = responses[-1].status_update
    assert "500" in failed.status.message.parts[0].text
    assert as_dict(failed.metadata)["error"]["reason"] == "PROVIDER_ERROR"


async def test_subscribing_replays_the_task_from_its_start(service: A2AService) -> None:
    service.provider.enqueue(answer_turn("Hel", "lo", reasoning="Hm"))
    client = await service.client("plain")
    first = await collect(client.send_message(user_message(text("Hi"))))
    again = await collect(client.subscribe(a2a.SubscribeToTaskRequest(id=first[0].task.id)))
    assert [brief(r) for r in again] == ONESHOT
    assert [as_dict(r) for r in again[1:]] == [as_dict(r) for r in first[1:]]
    with pytest.raises(TaskNotFoundError):
        await collect(client.subscribe(a2a.SubscribeToTaskRequest(id="nope")))
