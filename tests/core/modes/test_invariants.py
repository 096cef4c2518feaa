"""Property: whatever the model streams, every run's stream keeps the rules of SPEC §2.

Random scripted model behaviours — reasoning and content fragments, backend,
frontend, action and unknown tool calls (parallel, fragmented), streams cut off
or refused by the provider, in every mode, under tight budgets, sometimes
cancelled part-way — each stream must have seq 1..n, exactly one terminal event
(the last), every start ended before it, and well-formed ids.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from agw.v1 import gateway_pb2 as gw
from google.protobuf import struct_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.providers import loopback as lb
from service.providers.loopback import LoopbackProvider
from tests.core.tools.kit import agent, assert_invariants, tool_gateway, tools

TOOL_NAMES = ("echo", "boom", "pick", "theme", "ghost", "_plan_add_tasks_", "_plan_update_task_")
ARGUMENTS = ('{"text": "x"}', "{}", '{"tasks": [{"description": "a"}]}', '{"tas', "[]")

calls = st.lists(
    st.tuples(st.sampled_from(TOOL_NAMES), st.sampled_from(ARGUMENTS), st.integers(1, 3)),
    max_size=3,
)
turns = st.fixed_dictionaries(
    {
        "reasoning": st.lists(st.sampled_from(["Hm", " ok", "…"]), max_size=3),
        "content": st.lists(st.sampled_from(["Hi", " there", "!"]), max_size=3),
        "calls": calls,
        "end": st.sampled_from(["done", "done", "done", "cut", "refuse"]),
    }
)
behaviours = st.fixed_dictionaries(
    {
        "mode": st.sampled_from(["ONESHOT", "REACT", "PLAN_EXECUTE"]),
        "turns": st.lists(turns, min_size=1, max_size=5),
        "policy": st.sampled_from(["ALLOW", "REQUIRE", "DISALLOW"]),
        "output": st.sampled_from(["PLAIN", "REASONING_SUMMARY"]),
        "verify": st.sampled_from(["NONE", "SECOND_PASS_FIX"]),
        "cancel_at": st.none() | st.integers(3, 30),
    }
)


def script(index: int, turn: dict[str, Any]) -> list[lb.ScriptItem]:
    if turn["end"] == "refuse":
        return [lb.HttpError(503, {"error": {"message": "busy"}})]
    items: list[lb.ScriptItem] = [lb.reasoning(r) for r in turn["reasoning"]]
    items += [lb.content(c) for c in turn["content"]]
    fragments: list[list[dict[str, Any]]] = []
    for position, (name, arguments, pieces) in enumerate(turn["calls"]):
        size = max(1, len(arguments) // pieces)
        parts = [arguments[i : i + size] for i in range(0, len(arguments), size)] or [""]
        call_id = f"call_{index}_{position}"
        fragments.append(
            [lb.tool_call_part(position, call_id, name, parts[0])]
            + [lb.tool_call_part(position, arguments=p) for p in parts[1:]]
        )
    while any(fragments):  # interleave the parallel calls' fragments
        items.append(lb.tool_calls(*(f.pop(0) for f in fragments if f)))
    if turn["end"] == "cut":
        return [*items, lb.CLOSE]
    reason = "tool_calls" if turn["calls"] else "stop"
    return [*items, lb.finish(reason), lb.usage(5, 5), lb.DONE]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(behaviour=behaviours)
async def test_every_stream_keeps_the_streaming_rules(behaviour: dict[str, Any]) -> None:
    scripts = [script(i, t) for i, t in enumerate(behaviour["turns"])]

    def respond(body: dict[str, Any]) -> list[lb.ScriptItem]:
        return scripts.pop(0) if scripts else [lb.content("ok"), lb.finish("stop"), lb.DONE]

    definition = agent(
        behaviour["mode"],
        toolConfig=tools("echo", "boom", frontends=("pick",), actions=("theme",)),
        modelConfig={"reasoning": {"enabled": True}},
        toolPolicy=behaviour["policy"],
        output=behaviour["output"],
        verify=behaviour["verify"],
        budget={"maxModelCalls": 6, "maxToolCalls": 4, "maxSteps": 3, "timeoutMs": 5000},
    )
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            LoopbackProvider(respond) as provider,
            tool_gateway(
                Path(tmp), provider, {"a": definition}, frontend_wait_timeout_s=0.5
            ) as gateway,
        ):
            events = []
            call = gateway.stub.Query(gw.QueryRequest(agent_key="a", message="Go"))
            async for event in call:
                events.append(event)
                if len(events) == behaviour["cancel_at"]:
                    await gateway.stub.Cancel(gw.CancelRequest(run_id=event.run_id))
                elif event.type == "tool.end" and event.tool_end.tool_id.startswith("t_"):
                    await gateway.stub.Submit(
                        gw.SubmitRequest(
                            run_id=event.run_id,
                            tool_id=event.tool_end.tool_id,
                            payload=struct_pb2.Value(string_value="ok"),
                        )
                    )
    assert_invariants(events)
