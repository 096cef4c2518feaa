"""Calling any RPC of the gateway with raw bytes, and checking what comes back.

`invoke` sends request bytes to a method over the generic channel API (so that
bytes which are no request message can be sent too), reads the answer — every
event of a streaming call — and checks it: never a status that says the
service did not foresee the request, a status message and any response detail
of bounded size, and the streaming rules on every stream that started a run.
`answerer` keeps runs moving: it answers (or cancels) each frontend tool a run
waits on, after some misdirected answers first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import grpc
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from google.protobuf import message_factory, struct_pb2
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from service.core.events import TERMINALS
from service.gateway.server import AGENT_GATEWAY
from tests.core.tools.kit import assert_invariants
from tests.fuzz.kit import CALL_TIMEOUT_S, FORBIDDEN_CODES, MAX_MESSAGE_BYTES, FuzzService
from tests.fuzz.protos import JsonData, json_data, strings

Metadata = Sequence[tuple[str, str]]
Answer = Callable[[pb.Event], Awaitable[None]]

METHODS: dict[str, MethodDescriptor] = {m.name: m for m in AGENT_GATEWAY.methods}
EVENT = pb.Event.DESCRIPTOR.full_name
#: Besides INTERNAL and the like: the fuzz never cancels a call, so the service must not.
UNEXPECTED = FORBIDDEN_CODES | {grpc.StatusCode.CANCELLED}
ANSWERED = frozenset({gw.SUBMIT_OUTCOME_ACCEPTED, gw.SUBMIT_OUTCOME_ALREADY_ANSWERED})


def path_of(method: MethodDescriptor) -> str:
    return f"/{AGENT_GATEWAY.full_name}/{method.name}"


@dataclass
class Outcome:
    """What a call answered: its response or events, or its failure."""

    events: list[pb.Event] = field(default_factory=list)
    chunks: list[Message] = field(default_factory=list)  # a stream of another message (a file)
    response: Message | None = None
    error: grpc.aio.AioRpcError | None = None


def check_status(error: grpc.aio.AioRpcError, what: str) -> None:
    """A foreseen status with a bounded message."""
    code, details = error.code(), error.details() or ""
    assert code not in UNEXPECTED, f"{what}: {code.name}: {details[:500]!r}"
    size = len(details.encode())
    assert size <= MAX_MESSAGE_BYTES, f"{what}: a status message of {size} bytes"


def check_stream(method: MethodDescriptor, outcome: Outcome, after_seq: int = 0) -> None:
    """The streaming rules on a stream: Query's from seq 1, Attach's after `after_seq`."""
    events = outcome.events
    if not events:
        return
    assert outcome.error is None, (
        f"{method.name}: a stream that sent events ended with {outcome.error.code().name}"
    )
    if method.name == "Query":
        assert_invariants(events)
        return
    seqs = [e.seq for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"gaps or repeats: {seqs}"
    assert seqs[0] > after_seq or after_seq < 0
    assert terminals(events) == [len(events) - 1], "exactly one terminal event, the last"


async def invoke(
    service: FuzzService,
    method: MethodDescriptor,
    payload: bytes,
    metadata: Metadata = (),
    answer: Answer | None = None,
) -> Outcome:
    """Call `method` with `payload` as the request bytes and check the answer."""
    channel = service.harness.channel
    outcome = Outcome()
    try:
        async with asyncio.timeout(CALL_TIMEOUT_S):
            if method.server_streaming and method.output_type.full_name != EVENT:
                call = channel.unary_stream(path_of(method))(payload, metadata=metadata)
                outcome.chunks = [response_class(method).FromString(raw) async for raw in call]
            elif method.server_streaming:
                call = channel.unary_stream(path_of(method))(payload, metadata=metadata)
                async for raw in call:
                    event = pb.Event.FromString(raw)
                    outcome.events.append(event)
                    service.ids.note(event)
                    if answer is not None:
                        await answer(event)
            else:
                raw = await channel.unary_unary(path_of(method))(payload, metadata=metadata)
                outcome.response = response_class(method).FromString(raw)
                note_response(service, outcome.response)
    except grpc.aio.AioRpcError as error:
        outcome.error = error
        check_status(error, method.name)
    return outcome


def terminals(events: list[pb.Event]) -> list[int]:
    """The positions of the terminal events in `events`."""
    return [i for i, e in enumerate(events) if e.WhichOneof("payload") in TERMINALS]


def response_class(method: MethodDescriptor) -> type[Message]:
    return message_factory.GetMessageClass(method.output_type)


def note_response(service: FuzzService, response: Message) -> None:
    """Keep the ids a response names; check that its explanation is bounded."""
    detail = getattr(response, "detail", "")
    assert len(detail.encode()) <= MAX_MESSAGE_BYTES, f"a detail of {len(detail)} characters"
    if isinstance(response, gw.UploadResponse):
        service.ids.add("uploads", response.reference.id)
    elif isinstance(response, gw.ListChatsResponse):
        for chat in response.chats:
            service.ids.add("chats", chat.chat_id)
    elif isinstance(response, gw.GetChatResponse):
        for event in response.events:
            service.ids.note(event)


async def submit(
    service: FuzzService, request: gw.SubmitRequest, metadata: Metadata
) -> gw.SubmitResponse | None:
    outcome = await invoke(service, METHODS["Submit"], request.SerializeToString(), metadata)
    assert outcome.response is None or isinstance(outcome.response, gw.SubmitResponse)
    return outcome.response


async def cancel(service: FuzzService, run_id: str, metadata: Metadata) -> None:
    request = gw.CancelRequest(run_id=run_id)
    await invoke(service, METHODS["Cancel"], request.SerializeToString(), metadata)


def payloads() -> st.SearchStrategy[JsonData]:
    """Submitted payloads: any JSON value, non-finite numbers and deep nesting included."""
    found = json_data(struct_pb2.Value.DESCRIPTOR)
    assert found is not None
    return found


@dataclass(frozen=True)
class Stray:
    """A misdirected answer to a waiting tool: which tool id, chat, caller, payload."""

    tool: int  # 0: the tool's id, 1: with a newline, 2: none, 3: `junk`
    chat: int  # 0: the run's chat, 1: none, 2: `junk`
    caller: int  # 0: the owner, 1: another principal, 2: no one
    junk: str
    payload: JsonData


strays = st.builds(
    Stray,
    st.integers(0, 3),
    st.integers(0, 2),
    st.integers(0, 2),
    strings(),
    payloads(),
)


@dataclass(frozen=True)
class Plan:
    """How to answer each frontend tool a run waits on: strays first, then answer or cancel."""

    strays: tuple[Stray, ...] = ()
    cancel: bool = False


plans = st.builds(Plan, st.lists(strays, max_size=2).map(tuple), st.booleans())


def answerer(
    service: FuzzService, plan: Plan, metadata: Metadata, *, replay: bool = False
) -> Answer:
    """Answer (or cancel) each frontend tool a run of `metadata`'s caller waits on.

    Before the real answer, the plan's misdirected ones: a hostile payload, the
    wrong caller, the wrong chat, a bent tool id. Each must be refused or ignored
    without harm; the real answer or cancel then ends the wait. (The plan is drawn
    before the call, so that what is drawn never depends on what the service did.)
    `replay`: the events may be history (Attach), whose tools may have stopped waiting.
    """
    answered = ANSWERED | {gw.SUBMIT_OUTCOME_EXPIRED} if replay else ANSWERED

    async def answer(event: pb.Event) -> None:
        if event.type != "tool.end" or not event.tool_end.tool_id.startswith("t_"):
            return
        tool_id, run_id = event.tool_end.tool_id, event.run_id
        for stray in plan.strays:
            request = gw.SubmitRequest(
                run_id=run_id,
                tool_id=[tool_id, tool_id + "\n", "", stray.junk][stray.tool],
                chat_id=[event.chat_id, "", stray.junk][stray.chat],
            )
            stray.payload.write(request.payload)
            who = [metadata, FuzzService.metadata("bob"), ()][stray.caller]
            await submit(service, request, who)
        if plan.cancel:
            await cancel(service, run_id, metadata)
            return
        final = gw.SubmitRequest(run_id=run_id, tool_id=tool_id)
        final.payload.string_value = "Yes"
        response = await submit(service, final, metadata)
        assert response is not None, "the owner's answer to a waiting tool was refused"
        assert response.outcome in answered, response  # or answered above, by a stray submit

    return answer
