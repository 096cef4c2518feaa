"""The A2A endpoint of the HTTP adapter: one A2A agent per agw agent.

Routes, for every agent `{agentKey}`:

* `GET /a2a/{agentKey}/.well-known/agent-card.json` — its card (`GetAgent`);
* `POST /a2a/{agentKey}` — JSON-RPC: `SendStreamingMessage` / `message/stream`
  (Server-Sent Events), `SendMessage` / `message/send`, `GetTask` / `tasks/get`,
  `CancelTask` / `tasks/cancel`, `SubscribeToTask` / `tasks/resubscribe`, and the push
  notification configurations of a task (push.py).

The endpoint talks to the service only over the adapter's gRPC channel, with the
request's `Authorization` (and the other forwarded headers) as metadata, so
the service's authentication and ownership apply as on any route. The adapter's
protections apply too: allowed hosts and the origin check (its middlewares), a
JSON `Content-Type` (else 415) and the body limit (else 413).

A message without `taskId` starts a run (`Query`; `contextId` continues that
chat). A run that waits for the user (a frontend tool, a question, a permission,
a plan approval) ends the stream with `input-required`; a message naming the
task answers the wait (`Submit`: the message's data part, else its text) and
streams the rest of the run (`Attach`, from after the wait). A message whose
`metadata.waitId` names a wait answers that one, else the first one open; sent
while the run works, it answers the run's next wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from typing import Any
from urllib.parse import quote

import grpc
import orjson
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc
from aiohttp import web
from google.protobuf import json_format, struct_pb2

from service.gateway.a2a import jsonrpc
from service.gateway.a2a.card import agent_card
from service.gateway.a2a.dialect import (
    GET,
    SEND,
    STREAM,
    SUBSCRIBE,
    WORKING,
    Dialect,
    UserMessage,
    dialect_of,
)
from service.gateway.a2a.jsonrpc import RpcError
from service.gateway.a2a.push import PUSH_OPERATIONS, PushConfigs, webhook_of
from service.gateway.a2a.stream import SseWriter, Turn
from service.gateway.a2a.task import FILES_BASE, TaskFold
from service.gateway.metadata import Metadata, metadata_of
from service.gateway.sse import ClientGone
from service.gateway.status import failure, rpc_failure, shown
from service.gateway.transcode import BadRequest

log = logging.getLogger("agw.a2a")

_JSON_TYPE = re.compile(r"application/(?:[a-z0-9!#$&^_.-]+\+)?json")
#: Versions a client may ask for with the `A2A-Version` header.
_VERSIONS = re.compile(r"(?:1\.0|0\.3)(?:\.\d+)?")
#: How long tasks/cancel waits for the cancelled run's last event.
CANCEL_WAIT_S = 10.0
#: How long tasks/get waits for the events opening the waits a live run names.
LIVE_SETTLE_S = 2.0


class A2AEndpoint:
    """The A2A routes, calling the service over `channel`."""

    def __init__(self, channel: grpc.aio.Channel, *, write_timeout_s: float = 30.0) -> None:
        self.stub = gateway_pb2_grpc.AgentGatewayStub(channel)
        self.push = PushConfigs(self.stub)
        self.write_timeout_s = write_timeout_s

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/a2a/{agent_key}/.well-known/agent-card.json", self.card)
        router.add_post("/a2a/{agent_key}", self.rpc)

    # -- the card ----------------------------------------------------------------------

    async def card(self, request: web.Request) -> web.StreamResponse:
        key = request.match_info["agent_key"]
        try:
            reply = await self.stub.GetAgent(
                gw.GetAgentRequest(agent_key=key), metadata=metadata_of(request)
            )
        except BadRequest as error:
            return _json(failure(grpc.StatusCode.INVALID_ARGUMENT, str(error)), 400)
        except grpc.aio.AioRpcError as error:
            status, envelope = rpc_failure(error)
            return _json(envelope, status)
        url = f"{request.scheme}://{request.host}/a2a/{quote(key, safe='')}"
        return _json(agent_card(reply.agent, url))

    # -- JSON-RPC ----------------------------------------------------------------------

    async def rpc(self, request: web.Request) -> web.StreamResponse:
        """One JSON-RPC call; every failure is a JSON-RPC error, never a traceback."""
        call_id: jsonrpc.RequestId = None
        FILES_BASE.set(f"{request.scheme}://{request.host}")  # the files' download URLs
        try:
            call = await self._read(request)
            call_id = call.id
            dialect = dialect_of(call.method)
            if dialect is None:
                raise RpcError(jsonrpc.METHOD_NOT_FOUND, f"no method {shown(call.method)!r}")
            if call.method in dialect.unsupported:
                code = dialect.unsupported[call.method]
                raise RpcError(code, f"{call.method} is not supported by this agent")
            try:
                metadata = metadata_of(request)
            except BadRequest as error:
                raise RpcError(jsonrpc.INVALID_REQUEST, str(error)) from None
            key = request.match_info["agent_key"]
            operation = dialect.methods[call.method]
            if operation in PUSH_OPERATIONS:
                answer = await self.push.call(operation, call.params, dialect.version, metadata)
                return _json(jsonrpc.result(call.id, answer))
            if operation in (SEND, STREAM):
                message = dialect.message_of(call.params)
                push = _push_config(call.params, dialect.version)
                if operation == STREAM:
                    return await self._stream(request, call, dialect, key, message, metadata, push)
                task = await self._send(key, message, metadata, push)
                return _json(jsonrpc.result(call.id, dialect.send_result(task)))
            task_id = _task_id(call.params)
            if operation == SUBSCRIBE:
                return await self._subscribe(request, call, dialect, task_id, metadata)
            if operation == GET:
                task = await self._get(task_id, metadata)
            else:
                task = await self._cancel(task_id, metadata)
            _apply_history_length(task, call.params.get("historyLength"))
            return _json(jsonrpc.result(call.id, dialect.task(task)))
        except RpcError as error:
            if error.request_id is None:
                error.request_id = call_id
            return _json(jsonrpc.failure(error), error.http_status)
        except grpc.aio.AioRpcError as error:
            refusal = jsonrpc.from_status(error)
            refusal.request_id = call_id
            return _json(jsonrpc.failure(refusal), refusal.http_status)
        except Exception:
            log.exception("A2A %s failed", shown(request.path))
            refusal = RpcError(jsonrpc.INTERNAL_ERROR, "internal error", request_id=call_id)
            return _json(jsonrpc.failure(refusal), 500)

    async def _read(self, request: web.Request) -> jsonrpc.Request:
        given = request.headers.get("Content-Type", "")
        if not given or not _JSON_TYPE.fullmatch(request.content_type):
            raise RpcError(
                jsonrpc.INVALID_REQUEST,
                "Content-Type must be application/json",
                http_status=415,
            )
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge as error:
            raise RpcError(
                jsonrpc.INVALID_REQUEST, "payload too large", http_status=error.status
            ) from None
        call = jsonrpc.parse(body)
        version = request.headers.get("A2A-Version", "")
        if version and not _VERSIONS.fullmatch(version):  # refused with the request's id
            raise RpcError(
                jsonrpc.VERSION_NOT_SUPPORTED,
                f"A2A version {shown(version)!r} is not supported (1.0 and 0.3 are)",
                request_id=call.id,
            )
        return call

    # -- a turn: a new run, or an answer to a waiting one -------------------------------

    async def _begin(
        self,
        key: str,
        message: UserMessage,
        metadata: Metadata,
        push: gw.Webhook | None = None,
    ) -> Turn:
        """Start the turn; failures before anything streamed raise `RpcError`. `push`: the
        message's push configuration, given to the task (with the query, for a new one)."""
        if message.task_id:
            if push is not None:
                await self.stub.CreateRunWebhook(
                    gw.CreateRunWebhookRequest(run_id=message.task_id, webhook=push),
                    metadata=metadata,
                )
            return await self._answer(message, metadata)
        query = gw.QueryRequest(
            agent_key=key,
            chat_id=message.context_id,
            message=message.text,
            request_id=message.message_id,
            references=[
                pb.Reference(type="url", url=u["url"], name=u["name"], mime_type=u["mimeType"])
                for u in message.urls
            ],
        )
        params = next((d for d in message.data if isinstance(d, dict)), None)
        if params is not None:
            _parse_into(params, query.params)
        if push is not None:
            query.webhooks.append(push)
        if not message.text and params is None:
            raise jsonrpc.params_error("the message has no text and no data")
        call = self.stub.Query(query, metadata=metadata)
        fold = TaskFold(message.wire)
        try:
            first = await call.read()
        except grpc.aio.AioRpcError as error:
            raise jsonrpc.from_status(error) from None
        except BaseException:
            call.cancel()
            raise
        if not isinstance(first, pb.Event):
            raise RpcError(jsonrpc.INTERNAL_ERROR, "the run ended before it started")
        return Turn(call, fold, fold.apply(first))

    async def _answer(self, message: UserMessage, metadata: Metadata) -> Turn:
        """Submit the answer to the task's open wait; the turn streams what follows it."""
        answer = _answer_of(message)
        wanted = message.metadata.get("waitId")
        call = self.stub.Attach(gw.AttachRequest(run_id=message.task_id), metadata=metadata)
        fold = TaskFold()
        try:
            while isinstance(event := await call.read(), pb.Event):
                fold.apply(event)
                if message.context_id and fold.context_id and message.context_id != fold.context_id:
                    raise jsonrpc.params_error(
                        f"task {shown(message.task_id)!r} is not in context "
                        f"{shown(message.context_id)!r}"
                    )
                wait = fold.opened
                if wait is None or (wanted and wait.wait_id != wanted):
                    continue
                submit = gw.SubmitRequest(
                    request_id=message.message_id,
                    chat_id=fold.context_id,
                    run_id=fold.task_id,
                    tool_id=wait.wait_id,
                )
                _parse_payload(answer, submit)
                reply = await self.stub.Submit(submit, metadata=metadata)
                if reply.accepted:
                    fold.resume()
                    return Turn(call, fold, [("task", fold.task())])
        except grpc.aio.AioRpcError as error:
            call.cancel()
            raise jsonrpc.from_status(error) from None
        except BaseException:
            call.cancel()
            raise
        state = "is in a terminal state" if fold.done else "is not waiting for input"
        raise jsonrpc.params_error(f"task {shown(message.task_id)!r} {state}")

    # -- operations --------------------------------------------------------------------

    async def _stream(
        self,
        request: web.Request,
        call: jsonrpc.Request,
        dialect: Dialect,
        key: str,
        message: UserMessage,
        metadata: Metadata,
        push: gw.Webhook | None = None,
    ) -> web.StreamResponse:
        turn = await self._begin(key, message, metadata, push)
        return await self._relay(request, call, dialect, turn, stop_when_waiting=True)

    async def _subscribe(
        self,
        request: web.Request,
        call: jsonrpc.Request,
        dialect: Dialect,
        task_id: str,
        metadata: Metadata,
    ) -> web.StreamResponse:
        """The task's whole stream from its start, then live, to its end."""
        attach = self.stub.Attach(gw.AttachRequest(run_id=task_id), metadata=metadata)
        fold = TaskFold()
        try:
            first = await attach.read()
        except grpc.aio.AioRpcError as error:
            raise jsonrpc.from_status(error) from None
        if not isinstance(first, pb.Event):
            raise RpcError(jsonrpc.TASK_NOT_FOUND, f"no task {shown(task_id)!r}")
        turn = Turn(attach, fold, fold.apply(first))
        return await self._relay(request, call, dialect, turn, stop_when_waiting=False)

    async def _relay(
        self,
        request: web.Request,
        call: jsonrpc.Request,
        dialect: Dialect,
        turn: Turn,
        *,
        stop_when_waiting: bool,
    ) -> web.StreamResponse:
        stream = SseWriter(request, self.write_timeout_s)
        try:
            await stream.open()
            for update in turn.first:
                await stream.send(jsonrpc.result(call.id, dialect.stream_result(update)))
            if not (turn.fold.done or (stop_when_waiting and turn.fold.opened)):
                async for updates in turn.updates():
                    if not updates:
                        await stream.comment()
                    for update in updates:
                        await stream.send(jsonrpc.result(call.id, dialect.stream_result(update)))
                    if stop_when_waiting and turn.fold.opened is not None:
                        break
        except grpc.aio.AioRpcError as error:
            refusal = jsonrpc.from_status(error)
            refusal.request_id = call.id
            log.info("A2A stream of task %s ended with %s", turn.fold.task_id, error.code().name)
            await stream.send(jsonrpc.failure(refusal))
        except ClientGone as gone:
            log.info("A2A client of task %s: %s; closing", turn.fold.task_id, gone)
            if request.transport is not None:
                request.transport.abort()
        except Exception:
            log.exception("A2A stream of task %s failed", turn.fold.task_id)
            refusal = RpcError(jsonrpc.INTERNAL_ERROR, "internal error", request_id=call.id)
            with contextlib.suppress(ClientGone):
                await stream.send(jsonrpc.failure(refusal))
        finally:
            turn.call.cancel()
        return stream.response

    async def _send(
        self, key: str, message: UserMessage, metadata: Metadata, push: gw.Webhook | None = None
    ) -> dict[str, Any]:
        """The turn folded: the task once the run ended or waits for input."""
        turn = await self._begin(key, message, metadata, push)
        try:
            if not (turn.fold.done or turn.fold.opened):
                async for _ in turn.updates():
                    if turn.fold.opened is not None:
                        break
        except grpc.aio.AioRpcError as error:
            raise jsonrpc.from_status(error) from None
        finally:
            turn.call.cancel()
        return turn.fold.task()

    async def _get(self, task_id: str, metadata: Metadata) -> dict[str, Any]:
        """The task, found by its run (Attach): a run in progress (its chat's `liveRun`)
        folded from its events so far, what it waits for right now input-required; an
        ended one from its chat's history (GetChat)."""
        attach = self.stub.Attach(gw.AttachRequest(run_id=task_id), metadata=metadata)
        try:
            first = await attach.read()
            if not isinstance(first, pb.Event):
                raise RpcError(jsonrpc.TASK_NOT_FOUND, f"no task {shown(task_id)!r}")
            chat = await self.stub.GetChat(
                gw.GetChatRequest(chat_id=first.chat_id), metadata=metadata
            )
            fold = TaskFold()
            fold.apply(first)
            live = chat.live_run
            if chat.HasField("live_run") and live.run_id == task_id:
                await _fold_live(attach, fold, first.seq, live)
                return fold.task()
        finally:
            attach.cancel()
        for event in chat.events:
            if event.run_id == task_id and event.WhichOneof("payload") != "request_query":
                fold.apply(event)
        if not fold.done and not fold.waits and fold.state != WORKING:
            fold.resume()  # the run exists and has not ended: it works
        return fold.task()

    async def _cancel(self, task_id: str, metadata: Metadata) -> dict[str, Any]:
        """Cancel the run, and the task once the run has ended."""
        reply = await self.stub.Cancel(gw.CancelRequest(run_id=task_id), metadata=metadata)
        if not reply.cancelled:
            raise RpcError(
                jsonrpc.TASK_NOT_CANCELABLE, f"task {shown(task_id)!r} has already ended"
            )
        attach = self.stub.Attach(gw.AttachRequest(run_id=task_id), metadata=metadata)
        fold = TaskFold()
        try:
            async with asyncio.timeout(CANCEL_WAIT_S):
                async for event in attach:
                    fold.apply(event)
        except TimeoutError:
            log.warning("A2A: run %s did not end %.0f s after its cancel", task_id, CANCEL_WAIT_S)
        finally:
            attach.cancel()
        return fold.task()


async def _fold_live(attach: Any, fold: TaskFold, seq: int, live: gw.LiveRun) -> None:
    """Fold the live run's events after `seq` up to its last one so far (`live.last_seq`),
    and on until they have opened the waits `live` names (a replica's copy of the stream
    may trail its waits), for at most `LIVE_SETTLE_S`: a wait open leaves the task
    input-required."""
    missing = {wait.tool_id for wait in live.waits}
    try:
        async with asyncio.timeout(LIVE_SETTLE_S):
            while seq < live.last_seq or (missing and not fold.done):
                event = await attach.read()
                if not isinstance(event, pb.Event):
                    break
                if event.seq:  # not a heartbeat
                    seq = event.seq
                    fold.apply(event)
                    missing -= fold.waits.keys()
    except TimeoutError:
        log.warning("A2A: run %s showed its waits late; its task is read as it stands", live.run_id)


def _push_config(params: dict[str, Any], version: str) -> gw.Webhook | None:
    """The push configuration a send's `configuration` carries, as the task's webhook."""
    configuration = params.get("configuration")
    if configuration is None:
        return None
    if not isinstance(configuration, dict):
        raise jsonrpc.params_error("params.configuration must be an object")
    name = "taskPushNotificationConfig" if version == "1.0" else "pushNotificationConfig"
    config = configuration.get(name)
    return None if config is None else webhook_of(config, version)


def _task_id(params: dict[str, Any]) -> str:
    task_id = params.get("id")
    if not isinstance(task_id, str) or not task_id:
        raise jsonrpc.params_error("params.id must be the task's id (a non-empty string)")
    return task_id


def _answer_of(message: UserMessage) -> Any:
    """What a message answers a wait with: its first data part, else its text."""
    if not message.data and not message.text:
        raise jsonrpc.params_error("the message has no text and no data to answer with")
    return message.data[0] if message.data else message.text


def _parse_payload(answer: Any, submit: gw.SubmitRequest) -> None:
    """Set the Submit's payload to `answer`, its depth counted from the request (as the
    service reads it): an answer nested too deep is invalid params, not a failure."""
    try:
        json_format.ParseDict({"payload": answer}, submit)
    except json_format.ParseError as error:
        raise jsonrpc.params_error(f"the answer is not JSON a payload can carry: {error}") from None


def _parse_into(data: dict[str, Any], target: struct_pb2.Struct) -> None:
    try:
        json_format.ParseDict(data, target)
    except json_format.ParseError as error:
        raise jsonrpc.params_error(f"the data part cannot be query params: {error}") from None


def _apply_history_length(task: dict[str, Any], length: Any) -> None:
    if length is None:
        return
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise jsonrpc.params_error("historyLength must be a non-negative integer")
    history = task.get("history", [])
    task["history"] = history[-length:] if length else []


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")
