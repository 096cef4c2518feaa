"""Per-request overrides through gRPC and the HTTP adapter: what the agent file allows
changes the run's model calls and budgets; anything else is refused, saying what and why."""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import pytest
from agw.v1 import gateway_pb2 as gw

from service.providers.loopback import LoopbackProvider
from service.testing import Harness, write_agent
from tests.core.tools.kit import agent, call_turn, tools

ALLOWED = ["model", "temperature", "reasoning.effort", "budget.maxModelCalls"]


@pytest.fixture
def agents(tmp_path: Path) -> Path:
    directory = tmp_path / "agents"
    write_agent(
        directory,
        "open",
        agent(
            "PLAN_EXECUTE",
            overrides=ALLOWED,
            modelConfig={"temperature": 0.7, "reasoning": {"enabled": True, "effort": "LOW"}},
            toolConfig=tools("city_datetime"),
        )
        | {
            "planExecute": {
                "plan": {"systemPrompt": "Plan."},
                "execute": {"systemPrompt": "Do.", "modelConfig": {"temperature": 0.9}},
            }
        },
    )
    write_agent(directory, "closed", agent(toolConfig=tools("city_datetime")))
    return directory


async def test_allowed_overrides_reach_every_model_call_and_the_budget(
    agents: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(call_turn(("p1", "_plan_add_tasks_", '{"tasks": [{"description": "Go"}]}')))
    provider.enqueue(call_turn(("e1", "city_datetime", '{"city": "Paris"}')))
    async with Harness.start(agents, provider, http_enabled=False) as gateway:
        events = await gateway.query(
            "open",
            "Go",
            overrides=gw.RunOverrides(
                model="other-model", temperature=0.2, reasoning_effort="HIGH", max_model_calls=2
            ),
        )
        # the agent as the query left it is untouched for the next query
        again = gateway.app.agents.get("open")
    sent = [
        (r["model"], r.get("temperature"), r.get("reasoning_effort")) for r in provider.requests
    ]
    # the plan stage and the execute stage (which sets its own temperature): both overridden
    # (planning is done with reasoning off; the execute stage reasons, as hard as asked)
    assert sent == [("other-model", 0.2, None), ("other-model", 0.2, "high")]
    assert events[-1].type == "run.error"
    error = events[-1].run_error.error
    assert (error.reason, error.metadata["budget"], error.metadata["limit"]) == (
        "BUDGET_EXHAUSTED",
        "maxModelCalls",
        "2",
    )
    assert again.budget.max_model_calls == 20 and again.stage("execute").model.temperature == 0.9


async def test_an_override_the_agent_does_not_allow_is_refused_over_grpc_and_http(
    agents: Path, provider: LoopbackProvider
) -> None:
    async with Harness.start(agents, provider) as gateway:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await gateway.query(
                "closed", "Hi", overrides=gw.RunOverrides(temperature=0.1, max_steps=2)
            )
        with pytest.raises(grpc.aio.AioRpcError) as too_hot:
            await gateway.query("open", "Hi", overrides=gw.RunOverrides(temperature=3))
        async with httpx.AsyncClient(base_url=gateway.http_url) as http:
            response = await http.post(
                "/api/query",
                json={"agentKey": "open", "message": "Hi", "overrides": {"topP": 0.5}},
            )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == (
        "agent 'closed' does not allow a query to override temperature, budget.maxSteps "
        '(it allows nothing: the settings its file lists in "overrides")'
    )
    assert too_hot.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert too_hot.value.details() == (
        "overrides: temperature: Input should be less than or equal to 2 (got 3.0)"
    )
    assert response.status_code == 400
    body = response.json()
    assert (body["code"], body["reason"]) == (3, "INVALID_REQUEST")
    assert body["msg"] == (
        "agent 'open' does not allow a query to override top_p (it allows model, temperature, "
        'reasoning.effort, budget.maxModelCalls: the settings its file lists in "overrides")'
    )
    assert provider.requests == []
