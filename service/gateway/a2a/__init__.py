"""A2A (Agent2Agent) for agw's agents: agent cards and JSON-RPC, over the adapter's channel."""

from service.gateway.a2a.endpoint import A2AEndpoint

__all__ = ["A2AEndpoint"]
