"""The agent's tool permissions: ALLOW, DENY, and ASK answered (or not) through Submit."""

from __future__ import annotations

from pathlib import Path

import pytest
from agw.v1 import gateway_pb2 as gw

from service.core.run.permissions import allowed
from service.providers.loopback import LoopbackProvider
from tests.core.tools.kit import (
    Probe,
    agent,
    answer_turn,
    assert_invariants,
    call_turn,
    kinds,
    result_of,
    tool_gateway,
    tools,
)
from tests.transport.test_submit_cancel import submit, until

ECHO = call_turn(("call_1", "echo", '{"text":"hi"}'))


def guarded(permission: str) -> dict:
    return {"g": agent(toolConfig=tools("echo"), toolPermissions={"echo": permission})}


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (True, True),
        (False, False),
        ({"allowed": True}, True),
        ({"allowed": False}, False),
        ("yes", True),
        ("deny", False),
        (None, False),
        (1, False),
    ],
)
def test_payloads_that_grant(payload: object, expected: bool) -> None:
    assert allowed(payload) is expected


async def test_deny_refuses_the_call_and_the_run_goes_on(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(ECHO, answer_turn("Could not."))
    async with tool_gateway(tmp_path, provider, guarded("DENY"), Probe()) as gateway:
        events = await gateway.query("g", "Echo hi")
    assert_invariants(events)
    result = next(e for e in events if e.type == "tool.result")
    assert result.tool_result.error and "not permitted" in str(result_of(result))
    assert "permission.ask" not in kinds(events)
    assert events[-1].type == "run.complete"


@pytest.mark.parametrize(("payload", "runs"), [(True, True), ({"allowed": False}, False)])
async def test_ask_waits_for_the_users_answer(
    tmp_path: Path, provider: LoopbackProvider, payload: object, runs: bool
) -> None:
    probe = Probe()
    provider.enqueue(ECHO, answer_turn("Done."))
    async with tool_gateway(tmp_path, provider, guarded("ASK"), probe) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="g", message="Echo hi"))
        events: list = []
        ask = await until(call, "permission.ask", events)
        assert ask.permission_ask.tool_name == "echo"
        assert ask.permission_ask.permission_id.startswith("perm_")
        assert ask.permission_ask.arguments == '{"text":"hi"}'
        reply = await submit(gateway, ask.run_id, ask.permission_ask.permission_id, payload)
        assert reply.accepted
        events += [e async for e in call]
    assert_invariants(events)
    answer = next(e.permission_answer for e in events if e.type == "permission.answer")
    assert (answer.allowed, answer.reason) == (runs, "user")
    result = next(e for e in events if e.type == "tool.result")
    assert result.tool_result.error is (not runs)
    assert any(name == "echo" for name, _ in probe.calls) is runs
    assert events[-1].type == "run.complete"


async def test_ask_without_an_answer_is_a_refusal(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(ECHO, answer_turn("No answer."))
    async with tool_gateway(
        tmp_path, provider, guarded("ASK"), Probe(), frontend_wait_timeout_s=0.2
    ) as gateway:
        events = await gateway.query("g", "Echo hi")
    answer = next(e.permission_answer for e in events if e.type == "permission.answer")
    assert (answer.allowed, answer.reason) == (False, "timeout")
    result = next(e for e in events if e.type == "tool.result")
    assert "did not answer in time" in str(result_of(result))
    assert events[-1].type == "run.complete"
