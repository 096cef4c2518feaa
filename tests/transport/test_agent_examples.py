"""An agent's example prompts reach clients through ListAgents and GetAgent, gRPC and HTTP."""

from __future__ import annotations

from pathlib import Path

import httpx
from agw.v1 import gateway_pb2 as gw

from service.providers.loopback import LoopbackProvider
from service.testing import Harness, oneshot_agent, write_agent


async def test_list_and_get_agent_carry_the_examples(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents_dir = tmp_path / "agents"
    examples = ["What's the weather in Lyon?", "Plan a day in Rome"]
    write_agent(agents_dir, "guide", oneshot_agent("Guide.", examples=examples))
    write_agent(agents_dir, "plain", oneshot_agent("Plain."))
    async with Harness.start(agents_dir, provider) as gateway:
        listed = (await gateway.stub.ListAgents(gw.ListAgentsRequest())).agents
        assert {a.key: list(a.examples) for a in listed} == {"guide": examples, "plain": []}
        got = await gateway.stub.GetAgent(gw.GetAgentRequest(agent_key="guide"))
        assert list(got.agent.examples) == examples
        assert list(got.definition["examples"]) == examples

        async with httpx.AsyncClient(base_url=gateway.http_url) as http:
            body = (await http.get("/api/agents")).json()
        by_key = {a["key"]: a for a in body["data"]["agents"]}
        assert by_key["guide"]["examples"] == examples
        assert "examples" not in by_key["plain"]  # empty lists are left out, as protobuf JSON does
