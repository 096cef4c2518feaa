"""The gRPC servicer: translates RPCs into runtime calls, and errors into statuses."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from functools import wraps
from typing import Any, TypeAlias, TypeVar

import grpc
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc
from google.protobuf import json_format, struct_pb2

from service.core.agents import AgentDefinition
from service.core.errors import AgwError, InvalidRequest
from service.core.history import replay
from service.core.instruments import active_streams
from service.core.jsonl_store import check_chat_id
from service.core.runtime import Runtime
from service.core.waits import SubmitOutcome
from service.transport.errors import abort
from service.transport.tracing import rpc_span

log = logging.getLogger("agw.grpc")

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
R = TypeVar("R")
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500

SUBMIT_OUTCOMES: dict[SubmitOutcome, gw.SubmitOutcome.ValueType] = {
    "ACCEPTED": gw.SUBMIT_OUTCOME_ACCEPTED,
    "UNKNOWN_RUN": gw.SUBMIT_OUTCOME_UNKNOWN_RUN,
    "UNKNOWN_TOOL": gw.SUBMIT_OUTCOME_UNKNOWN_TOOL,
    "ALREADY_ANSWERED": gw.SUBMIT_OUTCOME_ALREADY_ANSWERED,
    "EXPIRED": gw.SUBMIT_OUTCOME_EXPIRED,
}

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
        with rpc_span(method.__name__, context):
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

    def __init__(self, runtime: Runtime, *, cancel_on_disconnect: bool = False) -> None:
        self.runtime = runtime
        self.cancel_on_disconnect = cancel_on_disconnect

    # Streaming handlers are coroutines writing with `context.write` rather than async
    # generators, so that the client going away cancels them deterministically and
    # their `finally` runs at once (see PITFALLS); the generated base declares iterators.
    async def Query(self, request: gw.QueryRequest, context: Context) -> None:  # type: ignore[override]
        with rpc_span("Query", context):
            try:
                run = await self.runtime.query(request)
            except AgwError as error:
                await abort(context, error)
                return
            try:
                await self._write_all(run.follow(0), context, "Query")
            finally:
                if not run.done and self.cancel_on_disconnect:
                    log.info("client of run %s went away; cancelling the run", run.run_id)
                    run.cancel("disconnect")

    async def Attach(self, request: gw.AttachRequest, context: Context) -> None:  # type: ignore[override]
        with rpc_span("Attach", context):
            try:
                events = await self.runtime.attach(request.run_id, request.after_seq)
            except AgwError as error:
                await abort(context, error)
                return
            live = self.runtime.runs.get(request.run_id)
            if live is not None and not live.done:  # accepted: the client may not wait for
                await context.send_initial_metadata(())  # an event to learn it (HTTP 200 now)
            await self._write_all(events, context, "Attach")

    @staticmethod
    async def _write_all(
        events: AsyncGenerator[pb.Event, None], context: Context, method: str
    ) -> None:
        """Write each event as one message, closing the iterator whatever happens."""
        labels = {"rpc.method": method}
        active_streams.add(1, labels)
        try:
            async with aclosing(events):
                async for event in events:
                    await context.write(event)
        except asyncio.CancelledError:
            raise
        except Exception:
            if context.done() or context.cancelled():
                return  # the client went away in the middle of a write
            raise
        finally:
            active_streams.add(-1, labels)

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

    @unary
    async def Submit(self, request: gw.SubmitRequest, context: Context) -> gw.SubmitResponse:
        result = self.runtime.submit(request)
        return gw.SubmitResponse(
            accepted=result.accepted,
            outcome=SUBMIT_OUTCOMES[result.outcome],
            detail=result.detail,
        )

    @unary
    async def ListChats(
        self, request: gw.ListChatsRequest, context: Context
    ) -> gw.ListChatsResponse:
        if request.page_size < 0:
            raise InvalidRequest("pageSize must be >= 0")
        size = min(request.page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        page, cursor = self.runtime.store.page(size, request.page_token)
        return gw.ListChatsResponse(
            chats=[
                gw.ChatSummary(
                    chat_id=c.chat_id,
                    chat_name=c.chat_name,
                    agent_key=c.agent_key,
                    created_at=c.created_at,
                    updated_at=c.updated_at,
                    run_count=c.run_count,
                )
                for c in page
            ],
            next_page_token=cursor,
        )

    @unary
    async def GetChat(self, request: gw.GetChatRequest, context: Context) -> gw.GetChatResponse:
        if not request.chat_id:
            raise InvalidRequest("chatId is required")
        check_chat_id(request.chat_id)
        records = await self.runtime.store.read(request.chat_id)
        summary = self.runtime.store.summary(request.chat_id)
        references = [
            ref
            for r in records
            if r.get("_type") == "query"
            for ref in (r.get("query") or {}).get("references") or []
        ]
        response = gw.GetChatResponse(
            chat_id=request.chat_id,
            chat_name=summary.chat_name if summary else "",
            events=replay(records),
        )
        for ref in references:
            json_format.ParseDict(ref, response.references.add(), ignore_unknown_fields=True)
        if request.include_raw_messages:
            for record in records:
                response.raw_messages.add().update(record)
        return response

    @unary
    async def Upload(self, request: gw.UploadRequest, context: Context) -> gw.UploadResponse:
        if request.chat_id:
            check_chat_id(request.chat_id)
        upload = await self.runtime.uploads.save(
            request.name, request.content, request.mime_type, request.chat_id
        )
        reference = pb.Reference(
            id=upload.id,
            type=upload.type,
            name=upload.name,
            mime_type=upload.mime_type,
            size_bytes=upload.size_bytes,
            sha256=upload.sha256,
        )
        event = pb.Event(
            seq=1,
            type="request.upload",
            timestamp=time.time_ns() // 1_000_000,
            chat_id=request.chat_id,
            request_upload=pb.RequestUpload(
                request_id=request.request_id or str(uuid.uuid4()),
                upload=pb.UploadInfo(
                    type=upload.type,
                    name=upload.name,
                    size_bytes=upload.size_bytes,
                    mime_type=upload.mime_type,
                    sha256=upload.sha256,
                ),
                reference_id=upload.id,
            ),
        )
        return gw.UploadResponse(reference=reference, event=event)
