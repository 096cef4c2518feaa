"""The A2A agent card of an agw agent.

One card per agent, served at `/a2a/{agentKey}/.well-known/agent-card.json`:
its name and description, one skill (the agent itself: its mode and tools as
tags), streaming and push notifications on, and the JSON-RPC endpoint
`/a2a/{agentKey}` offered in both protocol versions the endpoint speaks (1.0 and
0.3). The 0.3 card fields (`url`, `protocolVersion`, `preferredTransport`) are there
too, so 0.3 clients read the same card; 1.0 clients take `supportedInterfaces`.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from agw.v1 import gateway_pb2 as gw

MODES = ("text/plain", "application/json")


def agent_card(agent: gw.Agent, url: str) -> dict[str, Any]:
    """The card of `agent`, whose JSON-RPC endpoint is `url`."""
    mode = gw.AgentMode.Name(agent.mode).removeprefix("AGENT_MODE_").lower()
    tags = [mode, *agent.tools] if agent.mode else list(agent.tools)
    skill: dict[str, Any] = {
        "id": agent.key,
        "name": agent.name or agent.key,
        "description": agent.description or agent.name or agent.key,
        "tags": tags,
    }
    return {
        "name": agent.name or agent.key,
        "description": agent.description or agent.name or agent.key,
        "version": _version(),
        "supportedInterfaces": [
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
        ],
        "capabilities": {"streaming": True, "pushNotifications": True},
        "defaultInputModes": list(MODES),
        "defaultOutputModes": list(MODES),
        "skills": [skill],
        # The 0.3 form of the endpoint.
        "url": url,
        "protocolVersion": "0.3.0",
        "preferredTransport": "JSONRPC",
    }


def _version() -> str:
    try:
        return metadata.version("agw")
    except metadata.PackageNotFoundError:
        return "0.0.0"
