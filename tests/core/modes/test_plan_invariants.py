"""Property: parallel plans with a replanner and a verifier keep the streaming rules too.

Random scripted model behaviours (as in test_invariants, with the replanner's and
the verifier's tools among the calls), several tasks at once, budgets, streams cut
or refused, runs sometimes cancelled part-way: every stream has seq 1..n, one
terminal event (the last), every block paired and unique ids — however the tasks
interleave — and GetChat replays its snapshot form exactly.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from agw.v1 import gateway_pb2 as gw
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.core.chats.history import snapshot_form
from service.providers import loopback as lb
from service.providers.loopback import LoopbackProvider
from tests.core.modes.plan_kit import comparable
from tests.core.modes.test_invariants import script
from tests.core.tools.kit import agent, assert_invariants, tool_gateway, tools

PLAN = (
    '{"tasks": [{"description": "a"}, {"description": "b"}, '
    '{"description": "c", "dependsOn": [1, 2]}]}'
)
#: (tool, arguments) of the calls the model may make: right, wrong and unknown ones.
CALLS = (
    ("echo", '{"text": "x"}'),
    ("echo", '{"tas'),
    ("boom", "{}"),
    ("ghost", "{}"),
    ("_plan_add_tasks_", PLAN),
    ("_plan_update_task_", '{"status": "completed", "result": "ok"}'),
    ("_plan_update_task_", '{"status": "failed", "result": "no"}'),
    ("_plan_update_task_", "[]"),
    ("_plan_decide_", '{"decision": "continue", "reason": "ok"}'),
    ("_plan_decide_", '{"decision": "revise", "reason": "r", "tasks": [{"description": "d"}]}'),
    ("_plan_decide_", '{"decision": "finish", "reason": "f"}'),
    ("_plan_verify_", '{"verdict": "pass"}'),
    ("_plan_verify_", '{"verdict": "needsMorePlanning", "improvements": ["more"]}'),
)
#: What the model answers once its script is played, by the planning tool it is offered.
AFTERWARDS = (CALLS[5], CALLS[8], CALLS[11])
#: The first turn: a plan of three tasks, the third after the first two.
PLANNED = {"reasoning": [], "content": [], "calls": [("_plan_add_tasks_", PLAN, 2)], "end": "done"}

calls = st.lists(
    st.tuples(st.sampled_from(CALLS), st.integers(1, 3)).map(lambda c: (*c[0], c[1])),
    max_size=2,
)
turns = st.fixed_dictionaries(
    {
        "reasoning": st.lists(st.sampled_from(["Hm", " ok"]), max_size=2),
        "content": st.lists(st.sampled_from(["Hi", " there"]), max_size=2),
        "calls": calls,
        "end": st.sampled_from(["done"] * 8 + ["cut", "refuse"]),
    }
)
behaviours = st.fixed_dictionaries(
    {
        "turns": st.lists(turns, min_size=1, max_size=10),
        "parallel": st.integers(1, 3),
        "replan": st.booleans(),
        "verify": st.booleans(),
        "cancel_at": st.none() | st.integers(5, 40),
    }
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(behaviour=behaviours)
async def test_every_parallel_plan_stream_keeps_the_streaming_rules(
    behaviour: dict[str, Any],
) -> None:
    scripts = [script(i, t) for i, t in enumerate([PLANNED, *behaviour["turns"]])]
    later: list[str] = []

    def respond(body: dict[str, Any]) -> list[lb.ScriptItem]:
        if scripts:
            return scripts.pop(0)
        offered = {t["function"]["name"] for t in body.get("tools") or []}
        for name, arguments in AFTERWARDS:  # the script is played: the run goes to its end
            if name in offered:
                later.append(name)
                return script(100 + len(later), {**PLANNED, "calls": [(name, arguments, 1)]})
        return [lb.content("ok"), lb.finish("stop"), lb.DONE]

    stages: dict[str, Any] = {"execute": {"systemPrompt": "Do.", "parallel": behaviour["parallel"]}}
    if behaviour["replan"]:
        stages["replan"] = {"systemPrompt": "Review."}
    if behaviour["verify"]:
        stages["verify"] = {"systemPrompt": "Check.", "maxRounds": 2}
    definition = agent(
        "PLAN_EXECUTE",
        toolConfig=tools("echo", "boom"),
        modelConfig={"reasoning": {"enabled": True}},
        planExecute=stages,
        budget={"maxModelCalls": 30, "maxToolCalls": 6, "maxSteps": 6, "timeoutMs": 5000},
    )
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            LoopbackProvider(respond) as provider,
            tool_gateway(Path(tmp), provider, {"a": definition}) as gateway,
        ):
            events = []
            call = gateway.stub.Query(gw.QueryRequest(agent_key="a", message="Go"))
            async for event in call:
                events.append(event)
                if len(events) == behaviour["cancel_at"]:
                    await gateway.stub.Cancel(gw.CancelRequest(run_id=event.run_id))
            await gateway.app.frontdoor.flush()
            reply = await gateway.stub.GetChat(gw.GetChatRequest(chat_id=events[0].chat_id))
    assert_invariants(events)
    assert comparable(reply.events) == comparable(snapshot_form(events))
