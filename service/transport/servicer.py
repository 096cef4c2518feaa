"""The gRPC servicer: decodes each RPC into a front-door call, and errors into statuses.

Every handler goes through the codec (`service/transport/codec.py`) and the
front door (`service.core.frontdoor.FrontDoor`); none reaches a store or a run
registry directly. The streams (Query, Attach) send a `heartbeat` event after
each `heartbeat_s` of silence (0: never; see service/transport/heartbeat.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from functools import wraps
from typing import Any, TypeAlias, TypeVar

import grpc
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc
from google.api import httpbody_pb2  # type: ignore[import-untyped]

from service.core.errors import AgwError, InvalidRequest
from service.core.frontdoor import FrontDoor
from service.core.run.observation import active_streams
from service.transport import codec
from service.transport.errors import abort
from service.transport.guard import principal
from service.transport.heartbeat import StreamWriter
from service.transport.tracing import rpc_span

log = logging.getLogger("agw.grpc")
# The streaming methods' metric labels, shared by their calls (not a dict per open stream).
_LABELS = {method: {"rpc.method": method} for method in ("Query", "Attach")}
MAX_WAIT_MS = 600_000  # the longest a Wait may wait

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
R = TypeVar("R")
#: Answers ListModels: the assembly gives it (the models are the providers' business).
ModelCatalog: TypeAlias = Callable[[], Awaitable[gw.ListModelsResponse]]


async def no_models() -> gw.ListModelsResponse:
    return gw.ListModelsResponse()


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


#: Hands each event of a stream to `send`, in order, to the stream's end.
Relay: TypeAlias = Callable[[Callable[[pb.Event], Awaitable[object]]], Awaitable[None]]


def _relay_of(events: AsyncGenerator[pb.Event, None]) -> Relay:
    """The relay of an event iterator, which it closes whatever happens."""

    async def relay(send: Callable[[pb.Event], Awaitable[object]]) -> None:
        async with aclosing(events):
            async for event in events:
                await send(event)

    return relay


class AgentGatewayServicer(gateway_pb2_grpc.AgentGatewayServicer):
    """Serves the `agw.v1.AgentGateway` service from the core's front door."""

    def __init__(
        self,
        front: FrontDoor,
        *,
        cancel_on_disconnect: bool = False,
        heartbeat_s: float = 0.0,
        models: ModelCatalog = no_models,
    ) -> None:
        self.front = front
        self.cancel_on_disconnect = cancel_on_disconnect
        self.heartbeat_s = heartbeat_s
        self.models = models
        # The Attach streams (runs this process may not execute: followed through the run
        # bus, or read from the run log), by their handler's task: ended when the server
        # stops.
        self._followed: dict[asyncio.Task[Any], StreamWriter] = {}
        self._ending: set[asyncio.Task[Any]] = set()  # those being ended (cancelled)
        self._stopping = False

    # Streaming handlers are coroutines writing with `context.write` rather than async
    # generators, so that the client going away cancels them deterministically and
    # their `finally` runs at once (see PITFALLS); the generated base declares iterators.
    async def Query(self, request: gw.QueryRequest, context: Context) -> None:  # type: ignore[override]
        with rpc_span("Query", context):
            try:
                run = await self.front.query(
                    codec.query_command(request, principal()),
                    [codec.webhook_of(w) for w in request.webhooks],
                )
            except AgwError as error:
                await abort(context, error)
                return
            try:
                writer = StreamWriter(
                    context, self.heartbeat_s, run_id=run.run_id, chat_id=run.chat_id
                )
                await self._write_all(writer, "Query", run.relay, 0)
            except AgwError as error:  # the run was handed over: the client re-attaches
                await abort(context, error)
            finally:
                if not run.done and self.cancel_on_disconnect:
                    log.info("client of run %s went away; cancelling the run", run.run_id)
                    run.cancel("disconnect")

    async def Attach(self, request: gw.AttachRequest, context: Context) -> None:  # type: ignore[override]
        with rpc_span("Attach", context):
            try:
                who = principal()
                events = await self.front.attach(request.run_id, request.after_seq, who)
            except AgwError as error:
                await abort(context, error)
                return
            if await self.front.is_live(request.run_id, who):  # accepted: the client may not wait
                await context.send_initial_metadata(())  # for an event to learn it (HTTP 200)
            local = self.front.runs.get(request.run_id)  # its chat, for heartbeats before events
            writer = StreamWriter(
                context,
                self.heartbeat_s,
                run_id=request.run_id,
                chat_id=local.chat_id if local is not None else "",
                after_seq=request.after_seq,
            )
            # Ended when the server stops (`end_streams`, after the drain), if it has not
            # ended by then: a run this process executed has ended or was handed over (its
            # stream ends by itself, or is cut after the last seq it wrote); any other run,
            # followed through the bus or read from the run log, goes on elsewhere. Whether
            # the run is executed here may change while the stream is open (it is taken over
            # here, or handed over), so every Attach stream is one.
            try:
                await self._write_all(writer, "Attach", _relay_of(events), followed=True)
            except AgwError as error:  # the run was handed over: the client re-attaches
                await abort(context, error)

    async def _write_all(
        self,
        writer: StreamWriter,
        method: str,
        relay: Callable[..., Awaitable[None]],
        *args: Any,
        followed: bool = False,
    ) -> None:
        """Write each event `relay(*args, send)` hands on as one message (with heartbeats
        on silences).

        `followed`: a stream (Attach) of a run this process may not execute, which ends with
        `RunHandedOver` when the server stops (`end_streams`)."""
        task = asyncio.current_task() if followed else None
        if task is not None:
            if self._stopping:
                raise writer.moved()
            self._followed[task] = writer
        labels = _LABELS.get(method) or {"rpc.method": method}
        active_streams.add(1, labels)
        context = writer.context
        writer.start()
        try:
            await relay(*args, writer.write)
        except asyncio.CancelledError:
            if task is not None and task in self._ending and task.uncancel() == 0:
                if writer.ended:
                    return  # its run's end was written: nothing is left to follow
                raise writer.moved() from None  # ended by `end_streams`, between two writes
            raise
        except Exception:
            if context.done() or context.cancelled():
                return  # the client went away in the middle of a write
            raise
        finally:
            if task is not None:
                self._followed.pop(task, None)
                self._ending.discard(task)
            await writer.stop()
            active_streams.add(-1, labels)

    async def end_streams(self, timeout_s: float) -> None:
        """The server stops, its runs drained: end every Attach stream still open with
        `RunHandedOver` (UNAVAILABLE, reason RUN_HANDED_OVER, the last seq written), so that
        its client re-attaches elsewhere: at once when it waits for the next event, else
        after the write under way; wait at most `timeout_s` for them to end. The Query
        streams end by themselves (the drain ended or handed their runs over)."""
        self._stopping = True
        for task, writer in list(self._followed.items()):
            writer.ending = True
            if not (writer.writing or writer.ended):  # (one that ended is ending by itself)
                self._ending.add(task)
                task.cancel()
        if self._followed:
            await asyncio.wait(list(self._followed), timeout=timeout_s)

    @unary
    async def Start(self, request: gw.StartRequest, context: Context) -> gw.StartResponse:
        query = request.query
        webhooks = [codec.webhook_of(w) for w in query.webhooks]
        run = await self.front.start(codec.query_command(query, principal()), webhooks)
        return gw.StartResponse(run_id=run.run_id, chat_id=run.chat_id)

    @unary
    async def Wait(self, request: gw.WaitRequest, context: Context) -> gw.WaitResponse:
        if not 0 <= request.timeout_ms <= MAX_WAIT_MS:
            raise InvalidRequest(f"timeoutMs must be from 0 to {MAX_WAIT_MS}")
        waited = await self.front.wait(request.run_id, request.timeout_ms / 1000, principal())
        return codec.wait_response(*waited)

    @unary
    async def CreateRunWebhook(
        self, request: gw.CreateRunWebhookRequest, context: Context
    ) -> gw.RunWebhook:
        webhook = codec.webhook_of(request.webhook, request.webhook_id)
        added = await self.front.add_webhook(request.run_id, webhook, principal())
        return codec.run_webhook(added)

    @unary
    async def ListRunWebhooks(
        self, request: gw.ListRunWebhooksRequest, context: Context
    ) -> gw.ListRunWebhooksResponse:
        webhooks = await self.front.run_webhooks(request.run_id, principal())
        return gw.ListRunWebhooksResponse(webhooks=[codec.run_webhook(w) for w in webhooks])

    @unary
    async def GetRunWebhook(
        self, request: gw.GetRunWebhookRequest, context: Context
    ) -> gw.RunWebhook:
        webhook = await self.front.run_webhook(request.run_id, request.webhook_id, principal())
        return codec.run_webhook(webhook)

    @unary
    async def DeleteRunWebhook(
        self, request: gw.DeleteRunWebhookRequest, context: Context
    ) -> gw.DeleteRunWebhookResponse:
        await self.front.remove_webhook(request.run_id, request.webhook_id, principal())
        return gw.DeleteRunWebhookResponse()

    @unary
    async def Cancel(self, request: gw.CancelRequest, context: Context) -> gw.CancelResponse:
        cancelled = await self.front.cancel(request.run_id, principal())
        return gw.CancelResponse(
            cancelled=cancelled,
            detail="cancelling" if cancelled else "the run had already ended",
        )

    @unary
    async def ListAgents(
        self, request: gw.ListAgentsRequest, context: Context
    ) -> gw.ListAgentsResponse:
        version = self.front.agents.version_of
        return gw.ListAgentsResponse(
            agents=[codec.agent_message(a, version(a.key)) for a in self.front.list_agents()]
        )

    @unary
    async def GetAgent(self, request: gw.GetAgentRequest, context: Context) -> gw.GetAgentResponse:
        agent = self.front.get_agent(request.agent_key)
        return codec.agent_response(agent, self.front.agents.version_of(agent.key))

    @unary
    async def CreateAgent(
        self, request: gw.CreateAgentRequest, context: Context
    ) -> gw.AgentVersion:
        catalog = self.front.catalog
        definition = catalog.definition_of(codec.definition_of(request), request.definition_text)
        stored = await catalog.create(principal(), request.agent_key, definition, request.comment)
        return codec.agent_version(stored)

    @unary
    async def UpdateAgent(
        self, request: gw.UpdateAgentRequest, context: Context
    ) -> gw.AgentVersion:
        catalog = self.front.catalog
        definition = catalog.definition_of(codec.definition_of(request), request.definition_text)
        stored = await catalog.update(
            principal(), request.agent_key, definition, request.expected_version, request.comment
        )
        return codec.agent_version(stored)

    @unary
    async def RollbackAgent(
        self, request: gw.RollbackAgentRequest, context: Context
    ) -> gw.AgentVersion:
        stored = await self.front.catalog.rollback(
            principal(),
            request.agent_key,
            request.version,
            request.expected_version,
            request.comment,
        )
        return codec.agent_version(stored)

    @unary
    async def ListAgentVersions(
        self, request: gw.ListAgentVersionsRequest, context: Context
    ) -> gw.ListAgentVersionsResponse:
        versions = await self.front.catalog.versions(principal(), request.agent_key)
        return gw.ListAgentVersionsResponse(versions=[codec.agent_version(v) for v in versions])

    @unary
    async def Submit(self, request: gw.SubmitRequest, context: Context) -> gw.SubmitResponse:
        command = codec.submit_command(request, principal())
        return codec.submit_response(await self.front.submit(command))

    @unary
    async def ListChats(
        self, request: gw.ListChatsRequest, context: Context
    ) -> gw.ListChatsResponse:
        page, cursor = await self.front.list_chats(
            request.page_size, request.page_token, principal(), request.name_contains
        )
        return gw.ListChatsResponse(
            chats=[codec.chat_summary(c) for c in page], next_page_token=cursor
        )

    @unary
    async def GetChat(self, request: gw.GetChatRequest, context: Context) -> gw.GetChatResponse:
        view = await self.front.get_chat(
            request.chat_id,
            principal(),
            include_records=request.include_raw_messages,
            history=not request.live_run_only,
        )
        return codec.chat_response(view, include_raw_messages=request.include_raw_messages)

    @unary
    async def ListModels(
        self, request: gw.ListModelsRequest, context: Context
    ) -> gw.ListModelsResponse:
        return await self.models()

    @unary
    async def RenameChat(
        self, request: gw.RenameChatRequest, context: Context
    ) -> gw.RenameChatResponse:
        summary, event = await self.front.rename_chat(
            request.chat_id, request.chat_name, principal(), request.request_id
        )
        return gw.RenameChatResponse(chat=codec.chat_summary(summary), event=event)

    @unary
    async def DeleteChat(
        self, request: gw.DeleteChatRequest, context: Context
    ) -> gw.DeleteChatResponse:
        deleted = await self.front.delete_chat(
            request.chat_id, principal(), cancel_active_run=request.cancel_active_run
        )
        return gw.DeleteChatResponse(
            chat_id=deleted.chat_id,
            cancelled_run_id=deleted.cancelled_run_id,
            runs_deleted=deleted.runs,
            uploads_deleted=deleted.uploads,
        )

    @unary
    async def GetSpend(self, request: gw.GetSpendRequest, context: Context) -> gw.GetSpendResponse:
        rows, first, last = await self.front.spend(
            principal(), request.tenant, request.first_day, request.last_day
        )
        return gw.GetSpendResponse(
            rows=[codec.spend_row(row) for row in rows],
            currency=self.front.lifecycle.options.currency,
            first_day=first,
            last_day=last,
        )

    @unary
    async def ListFiles(
        self, request: gw.ListFilesRequest, context: Context
    ) -> gw.ListFilesResponse:
        files = await self.front.list_files(request.chat_id, principal())
        return gw.ListFilesResponse(files=[codec.workspace_file(f) for f in files])

    async def DownloadFile(self, request: gw.DownloadFileRequest, context: Context) -> None:  # type: ignore[override]
        """The file's bytes in chunks, the first with its content type (google.api.HttpBody)."""
        with rpc_span("DownloadFile", context):
            try:
                file, content = await self.front.download(
                    request.chat_id, request.path, principal()
                )
            except AgwError as error:
                await abort(context, error)
                return
            try:
                content_type = file.mime_type
                async for chunk in content:
                    await context.write(
                        httpbody_pb2.HttpBody(content_type=content_type, data=chunk)
                    )
                    content_type = ""
                if content_type:  # an empty file: one message, without bytes
                    await context.write(httpbody_pb2.HttpBody(content_type=content_type))
            finally:
                await content.aclose()

    @unary
    async def Upload(self, request: gw.UploadRequest, context: Context) -> gw.UploadResponse:
        command = codec.upload_command(request, principal())
        return codec.upload_response(await self.front.upload(command), command)
