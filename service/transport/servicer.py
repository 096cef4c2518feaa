"""The gRPC servicer: translates RPCs into runtime calls, and errors into statuses."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any, TypeAlias, TypeVar

import grpc
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc
from google.protobuf import json_format, struct_pb2

from service.core.agents import AgentDefinition
from service.core.errors import AgwError, InvalidRequest
from service.core.run import Run
from service.core.runtime import Runtime
from service.transport.errors import abort

log = logging.getLogger("agw.grpc")

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
R = TypeVar("R")

MODE_ENUM = {
    "ONESHOT": gw.AGENT_MODE_ONESHOT,
    "REACT": gw.AGENT_MODE_REACT,
    "PLAN_EXECUTE": gw.AGENT_MODE_PLAN_EXECUTE,
}


def unary(
    method: Callable[[Any, Any, Context], Awaitable[R]],
) -> Callable[[Any, Any, Context], Awaitable[R]]:
    """Turn the domain errors raised by a unary method into statuses."""

    @wraps(method)
    async def wrapper(self: Any, request: Any, context: Context) -> R:
        try:
            return await method(self, request, context)
        except AgwError as error:
            await abort(context, error)
            raise AssertionError("unreachable") from error

    return wrapper


def agent_message(agent: AgentDefinition) -> gw.Agent:
    return gw.Agent(
        key=agent.key,
        name=agent.name or agent.key,
        icon=agent.icon or "",
        description=agent.description or "",
        mode=MODE_ENUM[agent.mode],
        provider_key=agent.model_config_.provider_key or "" if agent.model_config_ else "",
        model=agent.model_config_.model or "" if agent.model_config_ else "",
        tools=agent.tool_names(),
    )


class AgentGatewayServicer(gateway_pb2_grpc.AgentGatewayServicer):
    """Serves the `agw.v1.AgentGateway` service from a `Runtime`."""

    def __init__(self, runtime: Runtime, *, cancel_on_disconnect: bool = True) -> None:
        self.runtime = runtime
        self.cancel_on_disconnect = cancel_on_disconnect

    # Streaming handlers are coroutines writing with `context.write` rather than async
    # generators, so that the client going away cancels them deterministically and
    # their `finally` runs at once (see PITFALLS); the generated base declares iterators.
    async def Query(self, request: gw.QueryRequest, context: Context) -> None:  # type: ignore[override]
        try:
            run = self.runtime.query(request)
        except AgwError as error:
            await abort(context, error)
            return
        await self._stream(run, 0, context)

    async def Attach(self, request: gw.AttachRequest, context: Context) -> None:  # type: ignore[override]
        try:
            if request.after_seq < 0:
                raise InvalidRequest("afterSeq must be >= 0")
            run = self.runtime.get_run(request.run_id)
        except AgwError as error:
            await abort(context, error)
            return
        await self._stream(run, request.after_seq, context, owner=False)

    async def _stream(self, run: Run, after_seq: int, context: Context, owner: bool = True) -> None:
        """Write the run's events from `after_seq` to the end, one message per event."""
        try:
            async for event in run.follow(after_seq):
                await context.write(event)
        finally:
            if owner and not run.done and self.cancel_on_disconnect:
                log.info("client of run %s went away; cancelling the run", run.run_id)
                run.cancel("disconnect")

    @unary
    async def Cancel(self, request: gw.CancelRequest, context: Context) -> gw.CancelResponse:
        cancelled = self.runtime.cancel(request.run_id)
        return gw.CancelResponse(
            cancelled=cancelled,
            detail="cancelling" if cancelled else "the run had already ended",
        )

    @unary
    async def ListAgents(
        self, request: gw.ListAgentsRequest, context: Context
    ) -> gw.ListAgentsResponse:
        return gw.ListAgentsResponse(agents=[agent_message(a) for a in self.runtime.agents.list()])

    @unary
    async def GetAgent(self, request: gw.GetAgentRequest, context: Context) -> gw.GetAgentResponse:
        if not request.agent_key:
            raise InvalidRequest("agentKey is required")
        agent = self.runtime.agents.get(request.agent_key)
        definition = struct_pb2.Struct()
        json_format.ParseDict(agent.to_json_dict(), definition)
        return gw.GetAgentResponse(agent=agent_message(agent), definition=definition)

    # Chat memory, Submit and Upload arrive with the chat-memory and tools milestones.

    async def Submit(self, request: gw.SubmitRequest, context: Context) -> gw.SubmitResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Submit is not available yet")
        raise AssertionError("unreachable")

    async def ListChats(
        self, request: gw.ListChatsRequest, context: Context
    ) -> gw.ListChatsResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "ListChats is not available yet")
        raise AssertionError("unreachable")

    async def GetChat(self, request: gw.GetChatRequest, context: Context) -> gw.GetChatResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "GetChat is not available yet")
        raise AssertionError("unreachable")

    async def Upload(self, request: gw.UploadRequest, context: Context) -> gw.UploadResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Upload is not available yet")
        raise AssertionError("unreachable")
