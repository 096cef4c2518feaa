"""Helpers of the A2A tests: the service with test agents, the official client, short forms.

The service is the whole `App` on loopback (gRPC, the HTTP adapter, a
`LoopbackProvider` as its model); the client is `a2a-sdk`'s, over real HTTP.
Stream responses are compared in a short form, `brief`, so that a test states
the exact sequence a client sees.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.client.client import Client
from a2a.types import a2a_pb2 as a2a
from google.protobuf import json_format

from service.providers.loopback import LoopbackProvider
from service.testing import Harness, write_agent
from tests.core.tools.kit import Probe, agent, tools, write_ui_tools

AGENTS = {
    "plain": agent(name="Plain", description="Answers in one go.", prompt="Be brief."),
    "thinker": agent(
        "REACT", name="Thinker", description="Thinks, then calls tools.", toolConfig=tools("echo")
    ),
    "ui": agent(toolConfig=tools(frontends=("pick",))),
    "slow": agent(toolConfig=tools("forever")),
    "asker": agent(toolConfig=tools("ask_user")),
}


@dataclass
class A2AService:
    """The service, an HTTP client of its adapter, and the probe's tools."""

    harness: Harness
    http: httpx.AsyncClient
    probe: Probe
    provider: LoopbackProvider

    def url(self, agent_key: str) -> str:
        return f"{self.harness.http_url}/a2a/{agent_key}"

    async def card(self, agent_key: str) -> a2a.AgentCard:
        return await A2ACardResolver(self.http, self.url(agent_key)).get_agent_card()

    async def client(
        self, agent_key: str, *, version: str = "1.0", streaming: bool = True
    ) -> Client:
        """The official client of the agent, speaking `version` (the card's interface of it)."""
        card = await self.card(agent_key)
        interfaces = [i for i in card.supported_interfaces if i.protocol_version == version]
        del card.supported_interfaces[:]
        card.supported_interfaces.extend(interfaces)
        config = ClientConfig(httpx_client=self.http, streaming=streaming)
        return ClientFactory(config).create(card)

    async def rpc(self, agent_key: str, body: Any, **headers: str) -> httpx.Response:
        """A raw JSON-RPC POST (a dict is sent as JSON, bytes as they are)."""
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers.setdefault("Content-Type", "application/json")
        return await self.http.post(self.url(agent_key), content=content, headers=headers)


@asynccontextmanager
async def a2a_service(
    tmp_path: Path, provider: LoopbackProvider, **settings: Any
) -> AsyncIterator[A2AService]:
    agents_dir = tmp_path / "agents"
    for key, definition in AGENTS.items():
        write_agent(agents_dir, key, definition)
    probe = Probe()
    tools_dir = write_ui_tools(tmp_path / "tools")
    async with Harness.start(agents_dir, provider, tools_dir=tools_dir, **settings) as harness:
        for tool in probe.tools():
            harness.app.tools.register(tool)
        async with httpx.AsyncClient(timeout=20.0) as http:
            yield A2AService(harness, http, probe, provider)


def user_message(*parts: a2a.Part, task_id: str = "", context_id: str = "", **extra: Any) -> Any:
    return a2a.SendMessageRequest(
        message=a2a.Message(
            message_id=extra.pop("message_id", "m-1"),
            role=a2a.Role.ROLE_USER,
            parts=list(parts),
            task_id=task_id,
            context_id=context_id,
            **extra,
        )
    )


def text(value: str) -> a2a.Part:
    return a2a.Part(text=value)


def data(value: Any) -> a2a.Part:
    part = a2a.Part()
    json_format.ParseDict(value, part.data)
    return part


def state(value: int) -> str:
    return a2a.TaskState.Name(value).removeprefix("TASK_STATE_").lower()


def brief(response: a2a.StreamResponse) -> tuple[Any, ...]:
    """A stream response in short: ("task", state), ("status", state, what) or
    ("artifact", text, append, lastChunk); `what` is the agw event a detail
    carries, or the text of the status message."""
    kind = response.WhichOneof("payload")
    if kind == "task":
        return ("task", state(response.task.status.state))
    if kind == "status_update":
        status = response.status_update.status
        message = status.message
        if "agwType" in message.metadata:
            return ("status", state(status.state), message.metadata["agwType"])
        texts = [p.text for p in message.parts if p.WhichOneof("content") == "text"]
        return ("status", state(status.state), *texts)
    if kind == "artifact_update":
        update = response.artifact_update
        pieces = "".join(p.text for p in update.artifact.parts)
        return ("artifact", pieces, update.append, update.last_chunk)
    return (kind,)


def as_dict(message: Any) -> dict[str, Any]:
    return json_format.MessageToDict(message)


async def collect(stream: AsyncIterator[a2a.StreamResponse]) -> list[a2a.StreamResponse]:
    return [response async for response in stream]
