"""Fuzz: runs that wait or stream are the target of random calls, from anyone.

One service for the module (see kit.py). Each example starts one to three runs
(waiting on a frontend tool, streaming slowly, planning, or in the sandbox) of
one principal, then makes random Submit, Cancel, Attach, GetChat, Upload and
Query calls at them (one after the other, or all at once), from their owner,
the other principal or no one, with their ids bent (a newline, a traversal, a
cut). Every call ends with a foreseen status; every stream keeps the streaming
rules once its run is cancelled, and an Attach gets exactly the events its run's
Query got after its `afterSeq`, whenever it joined. Last, nothing leaked,
nothing was written outside, nothing went wrong unnoticed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from agw.v1 import gateway_pb2 as gw
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.calls import METHODS, cancel, invoke, payloads, submit
from tests.fuzz.guards import assert_no_leaks
from tests.fuzz.kit import BENDS, COMMANDS, Bend, FuzzService, forget_runs, fuzz, settle
from tests.fuzz.protos import JsonData, strings
from tests.fuzz.streams import Stream, end_all, open_stream, started

pytestmark = pytest.mark.asyncio(loop_scope="module")

LIVE_AGENTS = ("react", "react", "slow", "plan", "sh")
OPS = ("submit", "cancel", "attach", "get_chat", "query_chat", "upload")
STRATEGIES = (
    gw.MULTITASK_STRATEGY_UNSPECIFIED,
    gw.MULTITASK_STRATEGY_REJECT,
    gw.MULTITASK_STRATEGY_ENQUEUE,
    gw.MULTITASK_STRATEGY_INTERRUPT,
    7,
)


def caller(kind: str, owner: str) -> str:
    """The owner, the other principal, or no one ("")."""
    other = "bob" if owner == "alice" else "alice"
    return {"owner": owner, "other": other, "nobody": ""}[kind]


@dataclass(frozen=True)
class Op:
    """One call aimed at a run: its kind, the run, the caller, how ids are bent, its values.

    Every value is drawn up front, whatever the kind, so that what is drawn never
    depends on what the service did.
    """

    kind: str
    index: int  # which run (modulo their number)
    who: str  # "owner", "other" or "nobody"
    bend: Bend
    tool: int  # which waiting tool (modulo their number)
    own_chat: bool  # Submit names the run's chat (else none)
    payload: JsonData
    flag: bool  # GetChat's includeRawMessages
    name: str  # Upload's file name
    content: bytes  # Upload's content
    after: int  # Attach's afterSeq
    agent: str  # Query's agent
    strategy: int  # Query's multitask strategy


ops = st.builds(
    Op,
    kind=st.sampled_from(OPS),
    index=st.integers(0, 7),
    who=st.sampled_from(["owner", "owner", "other", "nobody"]),
    bend=st.sampled_from(BENDS),
    tool=st.integers(0, 3),
    own_chat=st.booleans(),
    payload=payloads(),
    flag=st.booleans(),
    name=strings(),
    content=st.binary(max_size=64),
    after=st.integers(-1, 30) | st.sampled_from([2**63 - 1, -(2**63)]),
    agent=st.sampled_from(LIVE_AGENTS),
    strategy=st.sampled_from(STRATEGIES),
)


async def perform(service: FuzzService, op: Op, runs: list[Stream]) -> list[Stream]:
    """One call aimed at one of `runs`; the streams it opened."""
    target = runs[op.index % len(runs)]
    run_id, chat_id = op.bend(target.run_id), op.bend(target.chat_id)
    who = caller(op.who, target.owner)
    metadata = FuzzService.metadata(who)
    if op.kind == "submit":
        tools = target.waiting_tools() or [""]
        request = gw.SubmitRequest(
            run_id=run_id,
            tool_id=op.bend(tools[op.tool % len(tools)]),
            chat_id=chat_id if op.own_chat else "",
        )
        op.payload.write(request.payload)
        await submit(service, request, metadata)
    elif op.kind == "cancel":
        await cancel(service, run_id, metadata)
    elif op.kind == "get_chat":
        request = gw.GetChatRequest(chat_id=chat_id, include_raw_messages=op.flag)
        await invoke(service, METHODS["GetChat"], request.SerializeToString(), metadata)
    elif op.kind == "upload":
        request = gw.UploadRequest(chat_id=chat_id, name=op.name, content=op.content)
        await invoke(service, METHODS["Upload"], request.SerializeToString(), metadata)
    elif op.kind == "attach":
        request = gw.AttachRequest(run_id=run_id, after_seq=op.after)
        return [open_stream(service, request, who, metadata)]
    else:
        request = gw.QueryRequest(
            agent_key=op.agent,
            message="And now?",
            chat_id=chat_id,
            multitask_strategy=op.strategy,
        )
        return [open_stream(service, request, who, metadata)]
    return []


@fuzz(50)
@given(data=st.data())
async def test_requests_aimed_at_live_runs(service: FuzzService, data: st.DataObject) -> None:
    starts = data.draw(
        st.lists(
            st.tuples(
                st.sampled_from(LIVE_AGENTS),
                st.sampled_from(["alice", "bob"]),
                st.sampled_from(COMMANDS),  # the message of the `sh` agent
            ),
            min_size=1,
            max_size=3,
        ),
        label="runs",
    )
    runs: list[Stream] = []
    for agent_key, owner, command in starts:
        message = command if agent_key == "sh" else "Hi"
        request = gw.QueryRequest(agent_key=agent_key, message=message)
        runs.append(open_stream(service, request, owner, FuzzService.metadata(owner)))
    for run in runs:
        await started(run)
    calls = data.draw(st.lists(ops, max_size=8), label="calls")
    together = data.draw(st.booleans(), label="at once")
    joins = data.draw(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 12)), max_size=3))
    streams = list(runs)
    for index, after in joins:  # the owners re-join their runs, from some seq, meanwhile
        run = runs[index % len(runs)]
        request = gw.AttachRequest(run_id=run.run_id, after_seq=after)
        streams.append(open_stream(service, request, run.owner, FuzzService.metadata(run.owner)))
    try:
        if together:  # the calls race each other (a cancel and a submit, two queries...)
            opened = await asyncio.gather(*(perform(service, op, runs) for op in calls))
            streams += [stream for some in opened for stream in some]
        else:
            for op in calls:
                streams += await perform(service, op, runs)
    finally:
        await end_all(service, streams)
    for stream in streams:
        stream.check()
    assert_replays_match(streams)


def assert_replays_match(streams: list[Stream]) -> None:
    """Each Attach got exactly the events of its run's Query stream after its `afterSeq`."""
    logs = {s.run_id: s.events for s in streams if s.method == "Query" and s.run_id}
    for stream in streams:
        log = logs.get(stream.run_id)
        if stream.method != "Attach" or log is None:
            continue
        expected = [e.SerializeToString() for e in log if e.seq > stream.after_seq]
        assert [e.SerializeToString() for e in stream.events if e.seq] == expected, (
            f"Attach after {stream.after_seq} of run {stream.run_id}: "
            f"{[e.seq for e in stream.events]} instead of the Query's {[e.seq for e in log]}"
        )


async def test_nothing_leaked_and_nothing_written_outside(service: FuzzService) -> None:
    await settle(service)
    await assert_no_leaks(service)
    service.guard.check()
    await forget_runs(service)
    service.alarms.check()
