"""The AG-UI endpoint: `POST /api/ag-ui/{agentKey}`, an agw run as an AG-UI event stream.

An AG-UI client (e.g. `HttpAgent` of `@ag-ui/client`) posts a `RunAgentInput`
and reads Server-Sent Events, one AG-UI event per `data:` line. The endpoint
calls the service over the adapter's gRPC channel only, like every other route:

- `threadId` is the agw chat id (a new chat under that id on first use); the
  last message, a `user` message, is the query (agw keeps the conversation
  itself: earlier messages are not re-sent to the model); `forwardedProps` (an
  object) becomes the query's `params` and `context` its `scene.context`;
  `state` is kept and the plan is merged into it. `tools` are not offered to
  the model: an agent's frontend tools are those of its definition.
- The run's events are projected as `agui_events` says, each written at once.
- Frontend tools: when the run waits only for frontend tools, the AG-UI run
  ends (`RUN_FINISHED`, the calls in `outcome.pendingToolCallIds`) while the
  agw run keeps waiting. The next input whose messages end with `tool`
  messages answering them is `Submit`ted to that run, and the AG-UI run
  continues its stream (`Attach` after the last event sent) instead of
  starting a new query. A new user message instead interrupts the waiting run.
- Asks (a permission, a question, a plan approval) the run waits for end the
  AG-UI run with an `interrupt` outcome; the next input's `resume` entries are
  submitted as their answers, and the stream continues the same way.
  Waiting runs are remembered by this adapter process (the most recent
  `MAX_WAITING` threads).

The adapter's protections apply as on every route (allowed hosts, the origin
check, JSON bodies only, the body limit, `Authorization` passed on as
metadata); a request refused before the run starts gets the error envelope
and its HTTP status, a failure after it a `RUN_ERROR` event.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import orjson
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from aiohttp import web
from google.protobuf import json_format, struct_pb2

from service.gateway.agui_events import AgUiEvent, Projection, failed
from service.gateway.metadata import Metadata, metadata_of
from service.gateway.sse import EventStream
from service.gateway.status import error_info, failure, rpc_failure, shown
from service.gateway.transcode import BadRequest

if TYPE_CHECKING:
    from service.gateway.server import HttpGateway

PATH = "/api/ag-ui/{agentKey}"
#: Threads whose run waits for frontend tools, remembered at most (the oldest forgotten).
MAX_WAITING = 10_000
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


class AgUiEndpoint:
    """The handler of `POST /api/ag-ui/{agentKey}`, and the threads waiting for tools."""

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
        self.waiting: OrderedDict[str, Projection] = OrderedDict()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if not _is_json(request):
            message = "Content-Type must be application/json"
            return _envelope(failure(grpc.StatusCode.INVALID_ARGUMENT, message), 415)
        run_input = parse_input(await request.read())
        metadata = metadata_of(request.headers)
        answers = tool_answers(run_input.messages)
        if answers or run_input.resume:
            projection, refused = await self._answer(run_input, answers, metadata)
            if refused is not None:
                return refused
            call = self.attach(
                gw.AttachRequest(run_id=projection.agw_run_id, after_seq=projection.last_seq),
                metadata=metadata,
            )
        else:
            projection = Projection(run_input.thread_id, run_input.run_id, dict(run_input.state))
            call = self.query(self._query(request, run_input), metadata=metadata)
        stream = AgUiStream(
            request,
            ProjectedCall(call, projection, self._remember),
            heartbeat_s=self.gateway.heartbeat_s,
            write_timeout_s=self.gateway.write_timeout_s,
        )
        self.gateway.streams.add(stream)
        try:
            return await stream.serve()
        finally:
            self.gateway.streams.discard(stream)

    def _query(self, request: web.Request, run_input: RunInput) -> gw.QueryRequest:
        message = user_text(run_input.messages)
        query = gw.QueryRequest(
            chat_id=run_input.thread_id,
            agent_key=request.match_info["agentKey"],
            message=message,
        )
        if run_input.forwarded_props:
            query.params.update(run_input.forwarded_props)
        if run_input.context:
            query.scene.update({"context": run_input.context})
        if self.waiting.pop(run_input.thread_id, None) is not None:
            # the user moved on instead of answering the pending tool calls
            query.multitask_strategy = gw.MULTITASK_STRATEGY_INTERRUPT
        return query

    async def _answer(
        self, run_input: RunInput, answers: list[tuple[str, Any]], metadata: Metadata
    ) -> tuple[Projection, web.Response | None]:
        """Submit the tool results and the interrupts' answers to the thread's waiting run:
        its projection, and an error response if an answer was refused.

        The thread is taken from the waiting ones first, so that two inputs answering
        it at once cannot both continue it."""
        projection = self.waiting.pop(run_input.thread_id, None)
        interrupts = {i["id"]: i for i in projection.interrupts} if projection else {}
        pending = projection.pending if projection is not None else []
        if projection is not None:  # tool messages of earlier runs may still end the messages
            answers = [(i, payload) for i, payload in answers if i not in projection.answered]
        replies = [*answers]
        replies += [(i, _reply(interrupts.get(i), s, p)) for i, s, p in run_input.resume]
        unknown = [i for i, _ in answers if i not in pending]
        unknown += [i for i, _, _ in run_input.resume if i not in interrupts]
        if projection is None or unknown or not replies:
            if projection is not None:
                self._remember(projection)
            which = shown(unknown[0] if unknown else replies[0][0] if replies else "")
            raise BadRequest(
                f"{which!r} answers no pending tool call or interrupt of thread "
                f"{shown(run_input.thread_id)!r}; end the messages with a user message instead"
            )
        for answer_id, payload in replies:
            submit = gw.SubmitRequest(
                chat_id=run_input.thread_id,
                run_id=projection.agw_run_id,
                tool_id=answer_id,
                payload=json_format.ParseDict(payload, struct_pb2.Value()),
            )
            try:
                response = await self._submit(submit, metadata)
            except grpc.aio.AioRpcError as error:  # the run may still wait: keep the thread
                self._remember(projection)
                status, envelope = rpc_failure(error)
                return projection, _envelope(envelope, status)
            if not response.accepted:
                outcome = gw.SubmitOutcome.Name(response.outcome).removeprefix("SUBMIT_OUTCOME_")
                message = f"{answer_id!r} cannot be answered: {outcome}"
                detail = f"{message} ({response.detail})" if response.detail else message
                envelope = failure(grpc.StatusCode.FAILED_PRECONDITION, detail, reason=outcome)
                return projection, _envelope(envelope, 400)
        projection.resume(run_input.run_id, [answer_id for answer_id, _ in replies])
        return projection, None

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

    def _remember(self, projection: Projection) -> None:
        """Keep a thread whose run waits for the client's tool results."""
        self.waiting[projection.thread_id] = projection
        self.waiting.move_to_end(projection.thread_id)
        while len(self.waiting) > MAX_WAITING:
            self.waiting.popitem(last=False)


class ProjectedCall:
    """A Query or Attach call read as AG-UI SSE frames (what `EventStream` relays).

    Each `read` returns the frames of the next agw event that has any, or EOF
    once the AG-UI run has ended. A failure before the first event is raised
    (the adapter answers it with its HTTP status); later, or a stream that ends
    without a terminal event, it becomes `RUN_ERROR`.
    """

    def __init__(self, call: Any, projection: Projection, on_block: Any) -> None:
        self.call = call
        self.projection = projection
        self.on_block = on_block
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
                if projection.pending or projection.interrupts:
                    self.on_block(projection)
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
    )


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


def _envelope(body: dict[str, Any], status: int) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _now() -> int:
    return int(time.time() * 1000)
