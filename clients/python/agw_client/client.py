"""The asyncio client of the gateway.

    async with AsyncClient("127.0.0.1:50051") as agw:
        async with agw.query("demo_oneshot", "Hello") as stream:
            async for event in stream:
                print(event.seq, event.type)
        print((await agw.ask("demo_oneshot", "Hello")).answer)

Every call raises `agw_client.errors.RpcError` subclasses for gRPC statuses.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import grpc
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc

from agw_client.errors import RpcError, from_rpc_error
from agw_client.fold import RunFolder, RunResult
from agw_client.messages import new_request_id, query_request, set_definition, to_value
from agw_client.options import ClientOptions, Follow, call_kwargs, resolve_options


class AsyncQueryStream:
    """The events of one run, as an async iterator; also a context manager that closes it.

    `run_id` and `chat_id` are known once the first event arrived. Leaving the
    `async with` block (or `close()`) before the end drops the stream; the run
    goes on and can be re-joined with `attach`, unless the gateway's disconnect
    policy is to cancel it. `cancel()` stops the run itself.

    The stream follows its run (see `agw_client.options`): when the gateway process
    streaming it shuts down and hands the run over (`RUN_HANDED_OVER`), or the
    connection is lost, it re-attaches after `last_seq` through the same target;
    `reattached` counts how often.
    """

    def __init__(
        self,
        client: AsyncClient,
        call: Any,
        run_id: str = "",
        *,
        request: gw.QueryRequest | None = None,
        deadline: float | None = None,
        after_seq: int = 0,
    ) -> None:
        self._client = client
        self._call = call
        self._request = request  # a query's, to send again when refused unstarted
        self._deadline = deadline
        self._follow = Follow(client.options)
        self.run_id = run_id
        self.chat_id = ""
        self.last_seq = after_seq
        self.folder = RunFolder()
        self._closed = False

    @property
    def reattached(self) -> int:
        """How often the stream re-attached to its run (or sent its query again)."""
        return self._follow.reattached

    def __aiter__(self) -> AsyncIterator[pb.Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[pb.Event]:
        while True:
            try:
                async for event in self._call:
                    self.run_id = self.run_id or event.run_id
                    self.chat_id = self.chat_id or event.chat_id
                    if event.seq:
                        self.last_seq = event.seq
                        self._follow.progressed()
                    self.folder.feed(event)
                    yield event
                return
            except grpc.aio.AioRpcError as error:
                failure = from_rpc_error(error)
                step = None if self._closed else self._next(failure)
                if step is None:
                    raise failure from error
            await asyncio.sleep(self._follow.backoff())
            self._call = self._client._call_again(
                step, self.run_id, self.last_seq, self._request, self._deadline
            )

    def _next(self, failure: RpcError) -> str | None:
        step = self._follow.next(failure.code, failure.reason, run_known=bool(self.run_id))
        return "attach" if step == "query" and self._request is None else step

    async def result(self) -> RunResult:
        """Read the stream to its end and return the folded result of the run."""
        async for _ in self:
            pass
        return self.folder.result

    async def cancel(self) -> gw.CancelResponse:
        """Ask the gateway to cancel this run; the stream then ends with `run.cancel`."""
        if not self.run_id:
            raise RuntimeError("the run id is not known before the first event")
        return await self._client.cancel(self.run_id)

    def close(self) -> None:
        """Drop the stream; the run itself goes on (see `cancel`) unless the gateway is set
        to cancel runs whose client went away."""
        self._closed = True
        self._call.cancel()

    async def __aenter__(self) -> AsyncQueryStream:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncClient:
    """An asyncio client of `agw.v1.AgentGateway`; see `ClientOptions` for the keyword options."""

    def __init__(
        self, target: str | None = None, *, options: ClientOptions | None = None, **settings: Any
    ) -> None:
        self.options = resolve_options(target, options, settings)
        credentials = self.options.credentials()
        args = self.options.channel_args()
        self.channel = (
            grpc.aio.secure_channel(self.options.target, credentials, options=args)
            if credentials
            else grpc.aio.insecure_channel(self.options.target, options=args)
        )
        self.stub = gateway_pb2_grpc.AgentGatewayStub(self.channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    def _kw(self, deadline: float | None, *, stream: bool = False) -> dict[str, Any]:
        return call_kwargs(self.options, deadline, stream=stream)

    async def _unary(self, method: Any, request: Any, deadline: float | None) -> Any:
        try:
            return await method(request, **self._kw(deadline))
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(error) from error

    # Runs

    def query(
        self, agent_key: str, message: str, *, deadline: float | None = None, **fields: Any
    ) -> AsyncQueryStream:
        """Start a run; `fields` are further `QueryRequest` fields (chat_id, params, ...)."""
        return self.query_request(query_request(agent_key, message, **fields), deadline=deadline)

    def query_request(
        self, request: gw.QueryRequest, *, deadline: float | None = None
    ) -> AsyncQueryStream:
        """Start a run from a ready `QueryRequest`."""
        call = self.stub.Query(request, **self._kw(deadline, stream=True))
        return AsyncQueryStream(self, call, request=request, deadline=deadline)

    def _call_again(
        self,
        step: str,
        run_id: str,
        after_seq: int,
        request: gw.QueryRequest | None,
        deadline: float | None,
    ) -> Any:
        """The call a stream goes on with (see `AsyncQueryStream`): `Attach` after `after_seq`,
        or its query sent again."""
        kw = self._kw(deadline, stream=True)
        if step == "query" and request is not None:
            return self.stub.Query(request, **kw)
        return self.stub.Attach(gw.AttachRequest(run_id=run_id, after_seq=after_seq), **kw)

    async def ask(self, agent_key: str, message: str, **fields: Any) -> RunResult:
        """Run a query to its end; raise `RunFailed`/`RunCancelled` unless it completed."""
        async with self.query(agent_key, message, **fields) as stream:
            result = await stream.result()
        return result.raise_for_outcome()

    def attach(
        self, run_id: str, after_seq: int = 0, *, deadline: float | None = None
    ) -> AsyncQueryStream:
        """Re-join a run: the events after `after_seq`, then the live ones to the end."""
        request = gw.AttachRequest(run_id=run_id, after_seq=after_seq)
        call = self.stub.Attach(request, **self._kw(deadline, stream=True))
        return AsyncQueryStream(self, call, run_id, deadline=deadline, after_seq=after_seq)

    async def submit(
        self,
        run_id: str,
        tool_id: str,
        payload: Any,
        *,
        chat_id: str = "",
        view_id: str = "",
        request_id: str = "",
        deadline: float | None = None,
    ) -> gw.SubmitResponse:
        """Answer a waiting frontend tool, approval, permission or question with `payload`."""
        request = gw.SubmitRequest(
            request_id=request_id or new_request_id(),
            chat_id=chat_id,
            run_id=run_id,
            tool_id=tool_id,
            payload=to_value(payload),
            view_id=view_id,
        )
        response: gw.SubmitResponse = await self._unary(self.stub.Submit, request, deadline)
        return response

    async def cancel(self, run_id: str, *, deadline: float | None = None) -> gw.CancelResponse:
        """Stop a running run; its stream ends with `run.cancel`."""
        request = gw.CancelRequest(request_id=new_request_id(), run_id=run_id)
        response: gw.CancelResponse = await self._unary(self.stub.Cancel, request, deadline)
        return response

    # Agents, chats, files

    async def list_agents(self, *, deadline: float | None = None) -> list[gw.Agent]:
        response = await self._unary(self.stub.ListAgents, gw.ListAgentsRequest(), deadline)
        return list(response.agents)

    async def get_agent(
        self, agent_key: str, *, deadline: float | None = None
    ) -> gw.GetAgentResponse:
        request = gw.GetAgentRequest(agent_key=agent_key)
        response: gw.GetAgentResponse = await self._unary(self.stub.GetAgent, request, deadline)
        return response

    # The agent store (role "admin")

    async def create_agent(
        self,
        agent_key: str,
        definition: dict[str, Any] | str,
        *,
        comment: str = "",
        deadline: float | None = None,
    ) -> gw.AgentVersion:
        """Version 1 of an agent in the agent store: `definition` as JSON data, or as the
        text of an agent file."""
        request = gw.CreateAgentRequest(agent_key=agent_key, comment=comment)
        set_definition(request, definition)
        response: gw.AgentVersion = await self._unary(self.stub.CreateAgent, request, deadline)
        return response

    async def update_agent(
        self,
        agent_key: str,
        definition: dict[str, Any] | str,
        *,
        expected_version: int = 0,
        comment: str = "",
        deadline: float | None = None,
    ) -> gw.AgentVersion:
        """The next version of a stored agent (`expected_version`: the one it replaces)."""
        request = gw.UpdateAgentRequest(
            agent_key=agent_key, expected_version=expected_version, comment=comment
        )
        set_definition(request, definition)
        response: gw.AgentVersion = await self._unary(self.stub.UpdateAgent, request, deadline)
        return response

    async def rollback_agent(
        self,
        agent_key: str,
        version: int,
        *,
        expected_version: int = 0,
        comment: str = "",
        deadline: float | None = None,
    ) -> gw.AgentVersion:
        """A new version of a stored agent with the definition of its `version`."""
        request = gw.RollbackAgentRequest(
            agent_key=agent_key, version=version, expected_version=expected_version, comment=comment
        )
        response: gw.AgentVersion = await self._unary(self.stub.RollbackAgent, request, deadline)
        return response

    async def list_agent_versions(
        self, agent_key: str, *, deadline: float | None = None
    ) -> list[gw.AgentVersion]:
        """Every version of a stored agent, newest first."""
        request = gw.ListAgentVersionsRequest(agent_key=agent_key)
        response = await self._unary(self.stub.ListAgentVersions, request, deadline)
        return list(response.versions)

    async def list_chats(
        self,
        page_size: int = 0,
        page_token: str = "",
        *,
        name_contains: str = "",
        deadline: float | None = None,
    ) -> gw.ListChatsResponse:
        """One page of chats, newest first (with `name_contains`: those whose name contains
        it, ignoring case)."""
        request = gw.ListChatsRequest(
            page_size=page_size, page_token=page_token, name_contains=name_contains
        )
        response: gw.ListChatsResponse = await self._unary(self.stub.ListChats, request, deadline)
        return response

    async def rename_chat(
        self, chat_id: str, chat_name: str, *, deadline: float | None = None
    ) -> gw.RenameChatResponse:
        """Rename a chat; its `chat.update` event is in the answer and in its history."""
        request = gw.RenameChatRequest(
            chat_id=chat_id, chat_name=chat_name, request_id=new_request_id()
        )
        response: gw.RenameChatResponse = await self._unary(self.stub.RenameChat, request, deadline)
        return response

    async def delete_chat(
        self, chat_id: str, *, cancel_active_run: bool = False, deadline: float | None = None
    ) -> gw.DeleteChatResponse:
        """Delete a chat and everything of it; with `cancel_active_run`, its run in progress
        is cancelled first (else such a chat is refused: `ChatBusy`)."""
        request = gw.DeleteChatRequest(
            chat_id=chat_id, cancel_active_run=cancel_active_run, request_id=new_request_id()
        )
        response: gw.DeleteChatResponse = await self._unary(self.stub.DeleteChat, request, deadline)
        return response

    async def iter_chats(self, page_size: int = 0) -> AsyncIterator[gw.ChatSummary]:
        """Every chat, newest first, fetching page after page."""
        token = ""
        while True:
            page = await self.list_chats(page_size, token)
            for chat in page.chats:
                yield chat
            token = page.next_page_token
            if not token:
                return

    async def get_chat(
        self,
        chat_id: str,
        *,
        include_raw_messages: bool = False,
        live_run_only: bool = False,
        deadline: float | None = None,
    ) -> gw.GetChatResponse:
        """A chat's history as replayable events (with `live_run_only`, only its name and
        run in progress, its history not read)."""
        request = gw.GetChatRequest(
            chat_id=chat_id, include_raw_messages=include_raw_messages, live_run_only=live_run_only
        )
        response: gw.GetChatResponse = await self._unary(self.stub.GetChat, request, deadline)
        return response

    async def get_spend(
        self,
        *,
        tenant: str = "",
        first_day: str = "",
        last_day: str = "",
        deadline: float | None = None,
    ) -> gw.GetSpendResponse:
        """What runs used (calls, tokens, cost) by day, tenant, API key, agent and model: the
        caller's tenant, or (role "admin") `tenant`, "*" for all; this month by default."""
        request = gw.GetSpendRequest(tenant=tenant, first_day=first_day, last_day=last_day)
        response: gw.GetSpendResponse = await self._unary(self.stub.GetSpend, request, deadline)
        return response

    async def upload(
        self,
        name: str,
        content: bytes,
        *,
        mime_type: str = "",
        chat_id: str = "",
        deadline: float | None = None,
    ) -> gw.UploadResponse:
        """Store a file; put the returned `reference` in a later query's `references`."""
        request = gw.UploadRequest(
            request_id=new_request_id(),
            chat_id=chat_id,
            name=name,
            mime_type=mime_type,
            content=content,
        )
        response: gw.UploadResponse = await self._unary(self.stub.Upload, request, deadline)
        return response
