"""The projection's plan patches and its waiting rule, on hand-built agw events."""

from __future__ import annotations

from agw.v1 import events_pb2 as pb

from service.gateway.agui_events import Projection, _plan_patch

OLD = {"planId": "p", "tasks": [{"taskId": "t1", "description": "a", "status": "init"}]}


def test_a_status_change_is_one_replace() -> None:
    new = {"planId": "p", "tasks": [{"taskId": "t1", "description": "a", "status": "failed"}]}
    assert _plan_patch(OLD, new) == [
        {"op": "replace", "path": "/plan/tasks/0/status", "value": "failed"}
    ]
    assert _plan_patch(OLD, OLD) == []


def test_other_tasks_replace_the_plan_and_a_first_plan_is_added() -> None:
    revised = {"planId": "p", "tasks": [{"taskId": "t2", "description": "b", "status": "init"}]}
    assert _plan_patch(OLD, revised) == [{"op": "replace", "path": "/plan", "value": revised}]
    assert _plan_patch(None, OLD) == [{"op": "add", "path": "/plan", "value": OLD}]


def event(seq: int, **payload: object) -> pb.Event:
    return pb.Event(seq=seq, type="x", timestamp=1, chat_id="c", run_id="r", **payload)


def test_the_run_blocks_only_when_every_open_call_is_an_ended_frontend_call() -> None:
    projection = Projection("c", "ag1")
    projection.project(event(1, run_start=pb.RunStart(agent_key="a")))
    projection.project(
        event(2, tool_start=pb.ToolStart(tool_id="t_1", tool_name="pick", tool_type="html"))
    )
    projection.project(
        event(3, tool_start=pb.ToolStart(tool_id="b1", tool_name="echo", tool_type="backend"))
    )
    assert projection.project(event(4, tool_end=pb.ToolEnd(tool_id="t_1"))) == [
        {"type": "TOOL_CALL_END", "timestamp": 1, "toolCallId": "t_1"}
    ]
    projection.project(event(5, tool_end=pb.ToolEnd(tool_id="b1")))
    assert not projection.finished  # the backend call still runs
    assert projection.project(event(0, heartbeat=pb.Heartbeat())) == []
    out = projection.project(event(6, tool_result=pb.ToolResult(tool_id="b1")))
    assert [e["type"] for e in out] == ["TOOL_CALL_RESULT", "RUN_FINISHED"]
    assert out[-1]["outcome"] == {"type": "success", "pendingToolCallIds": ["t_1"]}
    assert (projection.finished, projection.last_seq, projection.pending) == (True, 6, ["t_1"])

    projection.resume("ag2", ["t_1"])
    submitted = projection.project(event(7, request_submit=pb.RequestSubmit(tool_id="t_1")))
    assert [e["type"] for e in submitted] == ["RUN_STARTED", "CUSTOM"]
    assert submitted[0]["runId"] == "ag2"
    assert projection.project(event(8, tool_result=pb.ToolResult(tool_id="t_1"))) == []
