"""Fuzz: every RPC of agw.v1.AgentGateway, with generated, damaged and random requests.

One service for the module (see kit.py). Each RPC gets requests generated from
its message descriptor by random callers (meaningful values mixed in: real agent
keys, ids of real chats, runs and tools; the frontend tools a run waits on are
answered, after misdirected answers), then damaged bytes and random bytes; the
sandboxed agent runs escapes and junk as commands. Every call must end with a
foreseen status (never INTERNAL, UNKNOWN, DATA_LOSS) and a bounded message;
every stream that started a run keeps the streaming rules. Last, once every run
has ended: no run slot, chat, waiting tool or sandbox slot is held (every slot
can be taken again), no file was written outside the service's directories, and
nothing went wrong unnoticed (no ERROR logged, no failure left unhandled).
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from agw.v1 import gateway_pb2 as gw
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.calls import (
    METHODS,
    answerer,
    check_status,
    check_stream,
    invoke,
    plans,
)
from tests.fuzz.guards import assert_no_leaks
from tests.fuzz.kit import (
    AGENT_KEYS,
    CALL_TIMEOUT_S,
    COMMANDS,
    WORKSPACE_PATHS,
    FuzzService,
    callers,
    forget_runs,
    fuzz,
    settle,
)
from tests.fuzz.protos import TIMEOUTS_MS, WEBHOOK_URLS, Hints, messages, mutated, strings
from tests.fuzz.streams import end_all, open_stream, started

pytestmark = pytest.mark.asyncio(loop_scope="module")

MESSAGES = ("Hi", "What time is it in Paris?", "tomorrow in Tokyo", *COMMANDS)


def hints(service: FuzzService) -> Hints:
    """Meaningful values for the fields that name things, mixed into the generated requests."""
    ids = service.ids
    return {
        "agent_key": st.sampled_from(AGENT_KEYS),
        "role": st.sampled_from(["", "user"]),
        "message": st.sampled_from(MESSAGES),
        "chat_id": st.just("") | ids.values("chats"),
        "run_id": ids.values("runs"),
        "tool_id": ids.values("tools"),
        "id": ids.values("uploads"),
        "after_seq": st.integers(0, 12),
        "page_token": st.just("") | strings(),
        "chat_name": st.sampled_from(["Renamed", "", "  ", "x" * 201]) | strings(),
        "name_contains": st.sampled_from(["", "hi", "HI", "%", "_"]) | strings(),
        "tenant": st.sampled_from(["", "*", "acme", "other"]) | strings(),
        "first_day": st.sampled_from(["", "2026-01-01", "2026-02-30", "1-1-1"]) | strings(),
        "last_day": st.sampled_from(["", "2026-12-31", "9999-12-31"]) | strings(),
        # (no valid definition: an agent written here would replace the agents the fuzzing runs)
        "definition_text": st.sampled_from(["", "{", '{"mode": "ONESHOT"}', '"""']) | strings(),
        "version": st.integers(-1, 4),
        "expected_version": st.integers(-1, 4),
        "path": st.sampled_from(WORKSPACE_PATHS) | strings(),
        "timeout_ms": TIMEOUTS_MS,
        "url": WEBHOOK_URLS | strings(),
    }


async def generated_request(service: FuzzService, name: str, data: st.DataObject) -> None:
    """Call `name` with a request generated from its descriptor, by a random caller."""
    method = METHODS[name]
    wild = data.draw(st.sampled_from([2, 10, 40]), label="one field in")
    request = data.draw(messages(method.input_type, hints(service), wild=wild), label="request")
    metadata = data.draw(callers(), label="caller")
    plan = data.draw(plans, label="answers")
    answer = answerer(service, plan, metadata, replay=name == "Attach")
    outcome = await invoke(service, method, request.SerializeToString(), metadata, answer)
    check_stream(method, outcome, getattr(request, "after_seq", 0))


@fuzz(120)
@given(data=st.data())
async def test_generated_queries(service: FuzzService, data: st.DataObject) -> None:
    await generated_request(service, "Query", data)


@pytest.mark.parametrize("name", sorted(set(METHODS) - {"Query"}))
@fuzz(40)
@given(data=st.data())
async def test_generated_requests(service: FuzzService, name: str, data: st.DataObject) -> None:
    await generated_request(service, name, data)


@pytest.mark.parametrize("name", sorted(METHODS))
@fuzz(30)
@given(data=st.data())
async def test_damaged_and_random_bytes(
    service: FuzzService, name: str, data: st.DataObject
) -> None:
    method = METHODS[name]
    payload = data.draw(
        st.binary(max_size=200) | mutated(messages(method.input_type, hints(service))),
        label="bytes",
    )
    metadata = data.draw(callers(), label="caller")
    plan = data.draw(plans, label="answers")
    answer = answerer(service, plan, metadata, replay=name == "Attach")
    outcome = await invoke(service, method, payload, metadata, answer)
    check_stream(method, outcome, after_seq=-1)


#: The other services the server hosts, which take no credentials.
HOSTED = (
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
)


@fuzz(30)
@given(path=st.sampled_from(HOSTED), payload=st.binary(max_size=100))
async def test_random_bytes_to_health_and_reflection(
    service: FuzzService, path: str, payload: bytes
) -> None:
    channel = service.harness.channel
    if path.endswith("/Check"):
        call = channel.unary_unary(path)(payload)
    elif path.endswith("/Watch"):
        call = channel.unary_stream(path)(payload)
    else:
        call = channel.stream_stream(path)(iter([payload]))
    try:
        async with asyncio.timeout(CALL_TIMEOUT_S):
            if path.endswith("/Check"):
                await call
            else:
                async for _ in call:
                    break  # Watch goes on for as long as one listens
    except grpc.aio.AioRpcError as error:
        check_status(error, path)
    finally:
        call.cancel()


@fuzz(20)
@given(command=st.sampled_from(COMMANDS) | strings())
async def test_sandboxed_commands(service: FuzzService, command: str) -> None:
    """The `sh` agent runs the message as its command: escapes and junk, each to its end."""
    request = gw.QueryRequest(agent_key="sh", message=command)
    outcome = await invoke(
        service, METHODS["Query"], request.SerializeToString(), FuzzService.metadata("alice")
    )
    check_stream(METHODS["Query"], outcome)
    if outcome.error is None:
        assert [e.type for e in outcome.events].count("tool.result") == 1
        assert outcome.events[-1].type == "run.complete"


# After the fuzzing ------------------------------------------------------------------------


async def test_nothing_leaked_and_every_slot_can_be_taken_again(service: FuzzService) -> None:
    await settle(service)
    await assert_no_leaks(service)
    limit = service.app.settings.max_concurrent_runs
    alice = FuzzService.metadata("alice")
    request = gw.QueryRequest(agent_key="react", message="Hi")
    waiting = [open_stream(service, request, "alice", alice) for _ in range(limit)]
    for stream in waiting:
        await started(stream)
    assert all(s.run_id and not s.task.done() for s in waiting), "a run was refused or ended"
    assert service.app.frontdoor.active_runs == limit
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        request = gw.QueryRequest(agent_key="oneshot", message="one more")
        async for _ in service.harness.stub.Query(request, metadata=alice):
            pass
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    await end_all(service, waiting)
    for stream in waiting:
        assert [e.type for e in stream.events][-1] == "run.cancel"
    await settle(service)
    await assert_no_leaks(service)
    service.guard.check()
    await forget_runs(service)
    service.alarms.check()
