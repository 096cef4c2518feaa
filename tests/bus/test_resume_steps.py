"""A run's owner lost at each kind of step, in each mode: the run completes on another
replica with the answer an uninterrupted run gives, and the model is asked what it would
have been asked — the interrupted turn once more, nothing else.

The model is a function of the request (`Model`), so that a turn asked again is answered
again the same way, whichever replica asks and whatever order parallel tasks ask in. The
owner (A) is lost by freezing it for Redis (its lease expires; its later writes are
fenced) while the run is inside the step: a model turn held mid-stream, a tool running, a
wait. Another replica adopts the run and resumes it; the follower on B reads one run.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw

from service.providers import loopback as lb
from service.providers.loopback import LoopbackProvider
from tests.bus.conftest import Replicas, started
from tests.core.modes.plan_kit import plan_agent
from tests.core.tools.kit import agent, tools
from tests.transport.test_server import assert_closed

Body = dict[str, Any]


def system(body: Body) -> str:
    first = body["messages"][0]
    return str(first["content"]) if first["role"] == "system" else ""


def results(body: Body) -> list[str]:
    """The contents of the tool results the request carries, in order."""
    return [str(m.get("content")) for m in body["messages"] if m["role"] == "tool"]


def said(body: Body) -> str:
    return json.dumps(body["messages"], ensure_ascii=False)


def calling(call_id: str, name: str, arguments: dict[str, Any]) -> list[lb.ScriptItem]:
    text = json.dumps(arguments)
    half = len(text) // 2
    return [
        lb.tool_call(0, call_id, name, text[:half]),
        lb.tool_call(0, arguments=text[half:]),
        lb.finish("tool_calls"),
        lb.usage(10, 5),
        lb.DONE,
    ]


def answering(*pieces: str) -> list[lb.ScriptItem]:
    return [*(lb.content(p) for p in pieces), lb.finish("stop"), lb.usage(10, 5), lb.DONE]


@dataclass
class Model:
    """Answers each request by `respond`; once armed, holds the first request `hold` picks
    after its first chunk, until released."""

    respond: Callable[[Body], list[lb.ScriptItem]]
    hold: Callable[[Body], bool] = lambda body: False
    armed: bool = False
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    provider: LoopbackProvider | None = None  # the server it answers for

    def __call__(self, body: Body) -> list[lb.ScriptItem]:
        script = self.respond(body)
        if self.armed and not self.reached.is_set() and self.hold(body):
            self.reached.set()
            return [script[0], lb.Gate(self.release), *script[1:]]
        return script


@dataclass
class Scenario:
    agents: dict[str, dict[str, Any]]
    agent_key: str
    respond: Callable[[Body], list[lb.ScriptItem]]
    hold: Callable[[Body], bool] | None = None  # the model turn A is lost in
    lost_after: str = ""  # else: A is lost once the run has emitted this event
    answer: Any = None  # what a wait of the run is answered


def react(body: Body) -> list[lb.ScriptItem]:
    if results(body):
        return answering("The echo ", "said a.")
    return calling("c1", "echo", {"text": "a"})


def task_of(body: Body) -> tuple[str, str]:
    """The plan task an execute request is for: (its id, its letter)."""
    task = re.search(r"Current task id: task_(\d)", said(body))
    assert task is not None, said(body)
    number = task.group(1)
    return f"task_{number}", "ab"[int(number) - 1]


def planned(body: Body) -> list[lb.ScriptItem]:
    prompt = system(body)
    if prompt.startswith("Plan it."):
        tasks = [{"description": "Echo a"}, {"description": "Echo b"}]
        return calling("p1", "_plan_add_tasks_", {"tasks": tasks})
    if prompt.startswith("Do it."):
        task_id, letter = task_of(body)
        if not results(body):
            return calling(f"e_{letter}", "echo", {"text": letter})
        report = {"taskId": task_id, "status": "completed", "result": f"{letter} echoed"}
        return calling(f"u_{letter}", "_plan_update_task_", report)
    if prompt.startswith("Check the results."):
        return calling("v1", "_plan_verify_", {"verdict": "pass"})
    return answering("Both ", "echoed.")


def verified(body: Body) -> list[lb.ScriptItem]:
    prompt = system(body)
    if prompt.startswith("Plan it."):
        return calling("p1", "_plan_add_tasks_", {"tasks": [{"description": "Find a"}]})
    if prompt.startswith("Do it."):
        report = {"taskId": "task_1", "status": "completed", "result": "a found"}
        return calling("u1", "_plan_update_task_", report)
    if prompt.startswith("Check the results."):
        return calling("v1", "_plan_verify_", {"verdict": "pass"})
    return answering("It is ", "a.")


def delegating(body: Body) -> list[lb.ScriptItem]:
    if system(body).startswith("Help."):
        return answering("hi ", "there")
    if results(body):
        return answering("The helper ", "says hi.")
    return calling("h1", "helper", {"task": "say hi"})


def napping(body: Body) -> list[lb.ScriptItem]:
    if results(body):
        return answering("Napped ", "well.")
    return calling("n1", "nap", {"text": "z"})


def picking(body: Body) -> list[lb.ScriptItem]:
    if results(body):
        return answering("You picked ", "b.")
    return calling("f1", "pick", {"options": ["a", "b"]})


SCENARIOS = {
    "react, a model turn": Scenario(
        {"r": agent("REACT", "React.", toolConfig=tools("echo"))},
        "r",
        react,
        hold=lambda body: bool(results(body)),
    ),
    "plan, parallel tasks": Scenario(
        {"p": plan_agent(execute={"parallel": 2})},
        "p",
        planned,
        hold=lambda body: system(body).startswith("Do it.") and task_of(body)[0] == "task_2",
    ),
    "plan, the verifier": Scenario(
        {"p": plan_agent(verify={"systemPrompt": "Check the results."})},
        "p",
        verified,
        hold=lambda body: system(body).startswith("Check the results."),
    ),
    "a subagent's turn": Scenario(
        {
            "boss": agent(
                "REACT",
                "Delegate.",
                toolConfig={"agents": ["helper"]},
                description="Calls others.",
            ),
            "helper": agent("ONESHOT", "Help.", description="Says hi."),
        },
        "boss",
        delegating,
        hold=lambda body: system(body).startswith("Help."),
    ),
    "an idempotent backend tool": Scenario(
        {"n": agent("REACT", "Nap.", toolConfig=tools("nap"))},
        "n",
        napping,
        lost_after="tool.end",
    ),
    "a wait": Scenario(
        {"ui": agent(toolConfig=tools(frontends=("pick",)))},
        "ui",
        picking,
        lost_after="tool.end",
        answer="b",
    ),
}


def normalised(request: Body) -> str:
    """A request's messages, without the ids a run draws for itself."""
    return re.sub(r"\b([a-z]+)_[0-9a-f]{8}\b", r"\1_…", said(request))


def final_answer(events: list[pb.Event]) -> str:
    """The run's own last answer block, whole."""
    starts = [e for e in events if e.type == "content.start" and not e.parent_tool_id]
    block = starts[-1].content_start.content_id
    return "".join(
        e.content_delta.delta
        for e in events
        if e.type == "content.delta" and e.content_delta.content_id == block
    )


async def answer_wait(replicas: Replicas, run_id: str, tool_id: str, payload: Any) -> None:
    """Submit `payload` through C until the run (wherever it runs now) takes it."""
    request = gw.SubmitRequest(run_id=run_id, tool_id=tool_id)
    request.payload.string_value = payload
    for _ in range(300):  # until the wait is open again where the run resumed
        if (await replicas["C"].stub.Submit(request)).accepted:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the wait was not answered")


async def play(
    replicas: Replicas, scenario: Scenario, model: Model, *, lose_owner: bool
) -> tuple[list[pb.Event], int]:
    """The run of the scenario's agent started on A and followed from B, to its end, and
    how many requests the model had when A was lost (with `lose_owner`: inside the step
    the scenario names)."""
    provider = model.provider
    assert provider is not None
    a, b = replicas["A"], replicas["B"]
    model.armed = lose_owner and scenario.hold is not None
    call = a.query(scenario.agent_key, "go")
    first = await anext(aiter(call))
    run_id = first.run_id
    following = b.stub.Attach(gw.AttachRequest(run_id=run_id))
    seen: list[pb.Event] = []
    lost_at = 0

    arrived: dict[str, asyncio.Event] = defaultdict(asyncio.Event)

    async def follow() -> None:
        async for event in following:
            seen.append(event)
            arrived[event.type].set()

    reader = asyncio.create_task(follow())
    try:
        if scenario.lost_after:
            await asyncio.wait_for(arrived[scenario.lost_after].wait(), 15)
        elif lose_owner:
            await asyncio.wait_for(model.reached.wait(), 15)
        if lose_owner:
            await asyncio.sleep(0.1)  # A is inside the step
            a.bus.suspend()
            lost_at = len(provider.requests)
            await asyncio.wait_for(arrived["run.resume"].wait(), 15)
            model.release.set()  # too late for A: the run is no longer its own
        if scenario.answer is not None:
            tool_id = next(e.tool_end.tool_id for e in seen if e.type == "tool.end")
            await answer_wait(replicas, run_id, tool_id, scenario.answer)
        await asyncio.wait_for(reader, 20)
    finally:
        reader.cancel()
        call.cancel()
        a.bus.resume()
    return seen, lost_at


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_a_run_whose_owner_is_lost_in_a_step_ends_as_if_it_had_not_been(
    tmp_path: Path, redis_url: str, name: str
) -> None:
    scenario = SCENARIOS[name]
    model = Model(scenario.respond, scenario.hold or (lambda body: False))
    async with (
        LoopbackProvider(model) as provider,
        started(
            tmp_path, provider, redis_url, lease_ttl_s=0.6, journal=True, agents=scenario.agents
        ) as replicas,
    ):
        model.provider = provider
        whole, _ = await play(replicas, scenario, model, lose_owner=False)
        first = len(provider.requests)
        lost, lost_at = await play(replicas, scenario, model, lose_owner=True)
        requests = list(zip(provider.requests, provider.request_headers, strict=True))
    asked = [request for request, _ in requests[:first]]
    # A, frozen for Redis but not dead, may go on for a while (its writes are fenced): what
    # the run asked is what A asked before it was lost, and what the replica that took it
    # over asked.
    adopter = next(e.run_resume.replica for e in lost if e.type == "run.resume")
    asked_again = [
        request
        for at, (request, headers) in enumerate(requests)
        if at >= first and (at < lost_at or headers["x-replica"] == adopter)
    ]
    assert whole[-1].type == lost[-1].type == "run.complete"
    assert final_answer(lost) == final_answer(whole)
    assert_closed(lost)
    resumed = [e.run_resume for e in lost if e.type == "run.resume"]
    assert [(r.reason, r.attempt) for r in resumed] == [("owner_lost", 1)]
    assert resumed[0].replica in ("B", "C")
    # The model was asked what the uninterrupted run asked it, and again only the turns
    # A was lost in (a turn held mid-stream; a parallel task's turn in flight then).
    before, after = Counter(map(normalised, asked)), Counter(map(normalised, asked_again))
    assert not before - after, "a request of the uninterrupted run was not made"
    again = after - before
    assert set(again) <= set(before), "a request was made that the uninterrupted run did not"
    if scenario.hold is not None:
        held = next(normalised(r) for r in asked_again if scenario.hold(r))
        assert again[held] == 1
    else:
        assert not again
