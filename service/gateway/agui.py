"""The AG-UI endpoint: `POST /api/ag-ui/{agentKey}`, an agw run as an AG-UI event stream.

An AG-UI client (e.g. `HttpAgent` of `@ag-ui/client`) posts a `RunAgentInput`
and reads Server-Sent Events, one AG-UI event per `data:` line. The endpoint
calls the service over the adapter's gRPC channel only, like every other route:

- `threadId` is the agw chat id (a new chat under that id on first use); the
  last message, a `user` message, is the query (agw keeps the conversation
  itself: earlier messages are not re-sent to the model); `forwardedProps` (an
  object) becomes the query's `params` and `context` its `scene.context`;
  `state` is kept and the plan is merged into it. `tools` are the query's
  `tools`: frontend tools of that run, answered by the client (the agent must
  allow them, `clientTools`). A thread with earlier runs gets its messages first
  (`MESSAGES_SNAPSHOT`, agui_messages.py).
- The run's events are projected as `agui_events` says, each written at once.
- Frontend tools: when the run waits only for frontend tools, the AG-UI run
  ends (`RUN_FINISHED`, the calls in `outcome.pendingToolCallIds`) while the
  agw run keeps waiting. The next input whose messages end with `tool`
  messages answering them is `Submit`ted to that run, and the AG-UI run
  continues its stream (the events after the block) instead of starting a new
  query. A new user message instead interrupts the waiting run.
- Asks (a permission, a question, a plan approval) the run waits for end the
  AG-UI run with an `interrupt` outcome; the next input's `resume` entries are
  submitted as their answers, and the stream continues the same way.
  Nothing is kept between AG-UI runs: the waiting run is found through GetChat
  (`liveRunOnly`: the thread's history is not read for it)
  and its projection rebuilt from its events (`agui_thread`), so the next
  input may reach any adapter process.

The adapter's protections apply as on every route (allowed hosts, the origin
check, JSON bodies only, the body limit, `Authorization` passed on as
metadata); a request refused before the run starts gets the error envelope
and its HTTP status, a failure after it a `RUN_ERROR` event.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
import orjson
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from aiohttp import web
from google.protobuf import json_format

from service.gateway.agui_events import AgUiEvent, Projection, failed
from service.gateway.agui_messages import thread_messages
from service.gateway.agui_thread import replay
from service.gateway.metadata import Metadata, metadata_of
from service.gateway.sse import EventStream
from service.gateway.status import error_info, failure, rpc_failure, shown
from service.gateway.transcode import BadRequest

if TYPE_CHECKING:
    from service.gateway.server import HttpGateway

PATH = "/api/ag-ui/{agentKey}"
#: How often, and how far apart, an answer that came before the run's wait is submitted again.
SUBMIT_RETRIES = 10
SUBMIT_RETRY_S = 0.05
_SERVICE = "/agw.v1.AgentGateway/"
_JSON_TYPE = re.compile(r"application/(?:[a-z0-9!#$&^_.-]+\+)?json")


def add_routes(app: web.Application, gateway: HttpGateway) -> None:
    """Serve the AG-UI endpoint on `app`, calling the service over `gateway`'s channel."""
    app.router.add_post(PATH, AgUiEndpoint(gateway).handle)


@dataclass(frozen=True, slots=True)
class RunInput:
    """The parts of an AG-UI `RunAgentInput` the endpoint uses."""

    thread_id: str
    run_id: str
    messages: list[dict[str, Any]]
    state: dict[str, Any]
    context: list[Any]
    forwarded_props: dict[str, Any]
    resume: list[tuple[str, str, Any]]  # (interruptId, status, payload)
    tools: list[dict[str, Any]] = field(default_factory=list)  # the client's own tools


class AgUiEndpoint:
    """The handler of `POST /api/ag-ui/{agentKey}`."""

    def __init__(self, gateway: HttpGateway) -> None:
        assert gateway.channel is not None
        channel = gateway.channel
        self.gateway = gateway
        self.query = channel.unary_stream(
            _SERVICE + "Query", gw.QueryRequest.SerializeToString, pb.Event.FromString
        )
        self.attach = channel.unary_stream(
            _SERVICE + "Attach", gw.AttachRequest.SerializeToString, pb.Event.FromString
        )
        self.submit = channel.unary_unary(
            _SERVICE + "Submit", gw.SubmitRequest.SerializeToString, gw.SubmitResponse.FromString
        )
        self.get_chat = channel.unary_unary(
            _SERVICE + "GetChat",
            gw.GetChatRequest.SerializeToString,
            gw.GetChatResponse.FromString,
        )

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if not _is_json(request):
            message = "Content-Type must be application/json"
            return _envelope(failure(grpc.StatusCode.INVALID_ARGUMENT, message), 415)
        run_input = parse_input(await request.read())
        metadata = metadata_of(request)
        try:
            opened = await self._open(request, run_input, metadata)
        except grpc.aio.AioRpcError as error:  # refused before the run's stream began
            status, envelope = rpc_failure(error)
            return _envelope(envelope, status)
        if isinstance(opened, web.Response):
            return opened
        call, projection = opened
        stream = AgUiStream(
            request,
            ProjectedCall(call, projection),
            heartbeat_s=self.gateway.heartbeat_s,
            write_timeout_s=self.gateway.write_timeout_s,
        )
        self.gateway.streams.add(stream)
        try:
            return await stream.serve()
        finally:
            self.gateway.streams.discard(stream)

    async def _open(
        self, request: web.Request, run_input: RunInput, metadata: Metadata
    ) -> tuple[Any, Projection] | web.Response:
        """The call this AG-UI run streams and its projection: a new query, or the thread's
        waiting run continued with the input's answers (a response when they are refused)."""
        answers = tool_answers(run_input.messages)
        chat = await self._chat(run_input.thread_id, metadata)
        live = chat.live_run if chat is not None and chat.HasField("live_run") else None
        if not (answers or run_input.resume):
            projection = Projection(run_input.thread_id, run_input.run_id, dict(run_input.state))
            query = self._query(request, run_input, interrupt=bool(live and live.waits))
            if chat is not None:  # a thread with a history: the client gets it whole first
                projection.snapshot = await self._messages(run_input, metadata)
            return self.query(query, metadata=metadata), projection
        if live is None:  # nothing waits: a late answer gets the service's reason
            return await self._late(run_input, answers, chat, metadata)
        return await self._continue(run_input, answers, live, metadata)

    async def _chat(self, thread_id: str, metadata: Metadata) -> gw.GetChatResponse | None:
        """The thread's chat, with its run in progress if any (None for a thread not begun)."""
        if not thread_id:
            return None
        try:
            chat: gw.GetChatResponse = await self.get_chat(
                gw.GetChatRequest(chat_id=thread_id, live_run_only=True), metadata=metadata
            )
        except grpc.aio.AioRpcError as error:
            if error.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                return None  # a new thread (or an id the query itself will refuse)
            raise
        return chat

    async def _messages(self, run_input: RunInput, metadata: Metadata) -> list[dict[str, Any]]:
        """The thread's messages so far, then the input's new user message."""
        chat = await self.get_chat(
            gw.GetChatRequest(chat_id=run_input.thread_id), metadata=metadata
        )
        last = run_input.messages[-1]
        current = {
            "id": last.get("id") or "",
            "role": "user",
            "content": user_text(run_input.messages),
        }
        return [*thread_messages(chat.events), current]

    async def _late(
        self,
        run_input: RunInput,
        answers: list[tuple[str, Any]],
        chat: gw.GetChatResponse | None,
        metadata: Metadata,
    ) -> web.Response:
        """Answers while no run of the thread waits: submitted to the thread's last run, the
        service says why it refuses them (expired, already answered) while it knows the run;
        else they answer nothing."""
        replies = answers or [(i, p) for i, _, p in run_input.resume]
        if chat is not None and replies:  # the thread's last run, from its history
            history = gw.GetChatRequest(chat_id=run_input.thread_id)
            chat = await self.get_chat(history, metadata=metadata)
        if chat is not None and chat.events and replies:
            answer_id, payload = replies[0]
            submit = submit_request(run_input.thread_id, chat.events[-1].run_id, answer_id, payload)
            response = await self.submit(submit, metadata=metadata)
            if response.outcome in (gw.SUBMIT_OUTCOME_EXPIRED, gw.SUBMIT_OUTCOME_ALREADY_ANSWERED):
                return _refused(answer_id, response)
        raise unanswerable(run_input, answers)

    def _query(
        self, request: web.Request, run_input: RunInput, *, interrupt: bool
    ) -> gw.QueryRequest:
        message = user_text(run_input.messages)
        query = gw.QueryRequest(
            chat_id=run_input.thread_id,
            agent_key=request.match_info["agentKey"],
            message=message,
            request_id=_message_id(run_input.messages[-1]),
        )
        for tool in run_input.tools:
            _parse_into_tool(tool, query.tools.add())
        if run_input.forwarded_props:
            query.params.update(run_input.forwarded_props)
        if run_input.context:
            query.scene.update({"context": run_input.context})
        if interrupt:  # the user moved on instead of answering what the run waits for
            query.multitask_strategy = gw.MULTITASK_STRATEGY_INTERRUPT
        return query

    async def _continue(
        self,
        run_input: RunInput,
        answers: list[tuple[str, Any]],
        live: gw.LiveRun,
        metadata: Metadata,
    ) -> tuple[Any, Projection] | web.Response:
        """The thread's waiting run, its projection rebuilt, the answers submitted: the
        Attach call that streams the rest and the projection, or the response refusing an
        answer."""
        projection = Projection(run_input.thread_id, run_input.run_id, dict(run_input.state))
        call = self.attach(gw.AttachRequest(run_id=live.run_id), metadata=metadata)
        try:
            blocked = await replay(call, projection, live.last_seq)
            refused = await self._answer(
                run_input, answers, projection if blocked else None, metadata
            )
        except BaseException:
            call.cancel()
            raise
        if refused is not None:
            call.cancel()
            return refused
        return call, projection

    async def _answer(
        self,
        run_input: RunInput,
        answers: list[tuple[str, Any]],
        projection: Projection | None,
        metadata: Metadata,
    ) -> web.Response | None:
        """Submit the tool results and the interrupts' answers to the run `projection`
        follows, blocked where the client answers it (None: no run waits): an error
        response if an answer was refused."""
        interrupts = {i["id"]: i for i in projection.interrupts} if projection else {}
        pending = projection.pending if projection is not None else []
        if projection is not None:  # tool messages of earlier runs may still end the messages
            answers = [(i, payload) for i, payload in answers if i not in projection.answered]
        replies = [*answers]
        replies += [(i, _reply(interrupts.get(i), s, p)) for i, s, p in run_input.resume]
        unknown = [i for i, _ in answers if i not in pending]
        unknown += [i for i, _, _ in run_input.resume if i not in interrupts]
        if projection is None or unknown or not replies:
            raise unanswerable(run_input, [(i, None) for i in unknown] or replies)
        for answer_id, payload in replies:
            submit = submit_request(run_input.thread_id, projection.agw_run_id, answer_id, payload)
            response = await self._submit(submit, metadata)
            if not response.accepted:
                return _refused(answer_id, response)
        projection.resume(run_input.run_id, [answer_id for answer_id, _ in replies])
        return None

    async def _submit(self, submit: gw.SubmitRequest, metadata: Metadata) -> gw.SubmitResponse:
        """Submit; an answer that arrives before the run has begun its wait is tried again.

        The AG-UI run ends once the agw run has emitted everything before its wait,
        and a fast client may answer before the wait is registered (UNKNOWN_TOOL):
        it is submitted again, up to `SUBMIT_RETRIES` times `SUBMIT_RETRY_S` apart.
        """
        response: gw.SubmitResponse = await self.submit(submit, metadata=metadata)
        for _ in range(SUBMIT_RETRIES):
            if response.outcome != gw.SUBMIT_OUTCOME_UNKNOWN_TOOL:
                break
            await asyncio.sleep(SUBMIT_RETRY_S)
            response = await self.submit(submit, metadata=metadata)
        return response


class ProjectedCall:
    """A Query or Attach call read as AG-UI SSE frames (what `EventStream` relays).

    Each `read` returns the frames of the next agw event that has any, or EOF
    once the AG-UI run has ended. A failure before the first event is raised
    (the adapter answers it with its HTTP status); later, or a stream that ends
    without a terminal event, it becomes `RUN_ERROR`.
    """

    def __init__(self, call: Any, projection: Projection) -> None:
        self.call = call
        self.projection = projection
        self._ended = False

    async def read(self) -> Any:
        projection = self.projection
        while not self._ended:
            try:
                message = await self.call.read()
            except grpc.aio.AioRpcError as error:
                if not projection.started:
                    raise
                reason, _ = error_info(error)
                return self._end(
                    failed(projection, error.details() or "", reason or error.code().name, _now())
                )
            if message is grpc.aio.EOF:
                if projection.finished:
                    self._ended = True
                    break
                return self._end(
                    failed(projection, "the run's stream ended early", "INTERNAL", _now())
                )
            events = projection.project(message)
            if projection.finished:
                return self._end(events)
            if events:
                return encode(events)
        return grpc.aio.EOF

    def _end(self, events: list[AgUiEvent]) -> bytes:
        self._ended = True
        self.call.cancel()
        return encode(events)

    def initial_metadata(self) -> Any:
        return self.call.initial_metadata()

    def done(self) -> bool:
        return bool(self.call.done())

    def cancel(self) -> bool:
        return bool(self.call.cancel())


class AgUiStream(EventStream):
    """An SSE response whose messages are ready-made AG-UI frames."""

    def _frame(self, message: Any) -> bytes:
        return bytes(message)


def encode(events: list[AgUiEvent]) -> bytes:
    """AG-UI events as SSE messages, one `data:` line of JSON each."""
    return b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in events)


def unanswerable(run_input: RunInput, answers: list[tuple[str, Any]]) -> BadRequest:
    """The refusal of answers (tool results, resume entries) no run of the thread waits for."""
    ids = [answer_id for answer_id, _ in answers] or [i for i, _, _ in run_input.resume]
    return BadRequest(
        f"{shown(ids[0] if ids else '')!r} answers no pending tool call or interrupt of thread "
        f"{shown(run_input.thread_id)!r}; end the messages with a user message instead"
    )


def parse_input(body: bytes) -> RunInput:
    """The `RunAgentInput` of a request body (BadRequest when it is not one)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadRequest("the body is not JSON (a RunAgentInput is expected)") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a RunAgentInput object")
    thread_id, run_id, messages = (
        data.get("threadId", ""),
        data.get("runId", ""),
        data.get("messages"),
    )
    if not isinstance(thread_id, str) or not isinstance(run_id, str) or not run_id:
        raise BadRequest("threadId and runId must be strings (runId not empty)")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise BadRequest("messages must be a list of message objects")
    state, context, props = data.get("state"), data.get("context"), data.get("forwardedProps")
    return RunInput(
        thread_id,
        run_id,
        messages,
        state if isinstance(state, dict) else {},
        context if isinstance(context, list) else [],
        props if isinstance(props, dict) else {},
        _resume_entries(data.get("resume")),
        _tools(data.get("tools")),
    )


def _tools(tools: Any) -> list[dict[str, Any]]:
    """The input's `tools`: objects with a `name`, a `description` and `parameters`."""
    if tools is None:
        return []
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise BadRequest("tools must be a list of tool objects")
    for index, tool in enumerate(tools):
        if not isinstance(tool.get("name"), str) or not isinstance(
            tool.get("description", ""), str
        ):
            raise BadRequest(f"tools[{index}] needs a name and a description (strings)")
        if not isinstance(tool.get("parameters", {}), dict):
            raise BadRequest(f"tools[{index}].parameters must be a JSON Schema object")
    return tools


def _parse_into_tool(tool: dict[str, Any], target: gw.ClientTool) -> None:
    """A tool of the input as the query's `ClientTool` (its `metadata` is the client's)."""
    target.name, target.description = tool["name"], tool.get("description", "")
    if "parameters" in tool:
        try:
            json_format.ParseDict(tool["parameters"], target.parameters)
        except json_format.ParseError as error:
            raise BadRequest(f"tool {shown(tool['name'])!r}: parameters: {error}") from None


def _message_id(message: dict[str, Any]) -> str:
    """The id of the client's message, as the query's request id (so the thread's history
    keeps it): when it is a short string."""
    message_id = message.get("id")
    return message_id if isinstance(message_id, str) and len(message_id) <= 128 else ""


def _resume_entries(resume: Any) -> list[tuple[str, str, Any]]:
    """The `resume` entries of an input: (interruptId, status, payload)."""
    if resume is None:
        return []
    entries = []
    for entry in resume if isinstance(resume, list) else [None]:
        if not isinstance(entry, dict) or not isinstance(entry.get("interruptId"), str):
            raise BadRequest("resume must be a list of {interruptId, status, payload?}")
        status = entry.get("status")
        if status not in ("resolved", "cancelled"):
            raise BadRequest("a resume entry's status must be 'resolved' or 'cancelled'")
        entries.append((entry["interruptId"], status, entry.get("payload")))
    return entries


def tool_answers(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """The trailing `tool` messages: (toolCallId, the result as a JSON value)."""
    answers: list[tuple[str, Any]] = []
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        call_id = message.get("toolCallId")
        if not isinstance(call_id, str) or not call_id:
            raise BadRequest("a tool message needs its toolCallId")
        answers.append((call_id, _value(_text(message.get("content")))))
    answers.reverse()
    return answers


def user_text(messages: list[dict[str, Any]]) -> str:
    """The text of the last message, which must be the user's."""
    last = messages[-1] if messages else {}
    text = _text(last.get("content")) if last.get("role") == "user" else ""
    if not text:
        raise BadRequest(
            "the last message must be a user message with text (or tool messages "
            "answering the thread's pending tool calls)"
        )
    return text


def submit_request(chat_id: str, run_id: str, tool_id: str, payload: Any) -> gw.SubmitRequest:
    """The Submit of a tool result or resume payload (any JSON value); BadRequest when the
    request cannot carry it: nested deeper than a message may be (the payload's depth
    counts from the request, as the service reads it)."""
    submit = gw.SubmitRequest(chat_id=chat_id, run_id=run_id, tool_id=tool_id)
    try:
        json_format.ParseDict({"payload": payload}, submit)
    except json_format.ParseError as error:
        raise BadRequest(f"the answer to {shown(tool_id)!r} cannot be submitted: {error}") from None
    return submit


def _reply(interrupt: dict[str, Any] | None, status: str, payload: Any) -> Any:
    """What an interrupt's resume entry submits: its payload, or if it was cancelled a
    refusal (false for a permission or an approval, null for a question)."""
    if status == "resolved":
        return payload
    return None if interrupt is not None and interrupt["reason"] == "question" else False


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(p for p in parts if isinstance(p, str))
    return ""


def _value(text: str) -> Any:
    """A tool result as the JSON value it spells, else the text itself."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _is_json(request: web.Request) -> bool:
    return "Content-Type" in request.headers and bool(_JSON_TYPE.fullmatch(request.content_type))


def _refused(answer_id: str, response: gw.SubmitResponse) -> web.Response:
    """The 400 answer to an answer the service did not accept, with its outcome as reason."""
    outcome = gw.SubmitOutcome.Name(response.outcome).removeprefix("SUBMIT_OUTCOME_")
    message = f"{answer_id!r} cannot be answered: {outcome}"
    detail = f"{message} ({response.detail})" if response.detail else message
    envelope = failure(grpc.StatusCode.FAILED_PRECONDITION, detail, reason=outcome)
    return _envelope(envelope, 400)


def _envelope(body: dict[str, Any], status: int) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _now() -> int:
    return int(time.time() * 1000)
