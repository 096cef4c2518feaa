"""A backend tool's progress reports: one `tool.progress` each, at once, bounded per call."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

from service.core.run.progress import CUT_NOTE, MAX_EVENTS, MAX_MESSAGE_CHARS
from service.core.tools.registry import BackendTool, ToolCallInfo
from service.providers.loopback import LoopbackProvider
from tests.core.tools.kit import (
    agent,
    answer_turn,
    assert_invariants,
    call_turn,
    definition,
    kinds,
    result_of,
    tool_gateway,
    tools,
)


async def chatty(arguments: dict[str, Any], call: ToolCallInfo) -> str:
    """Reports a long message, odd numbers, then more than a call may report."""
    assert call.progress is not None
    call.progress("x" * (MAX_MESSAGE_CHARS + 10), progress=0, total=math.inf)
    call.progress(progress=math.nan, total=2)
    await asyncio.sleep(0)
    for n in range(MAX_EVENTS + 20):
        call.progress(f"line {n}", stream="stdout")
    return "said a lot"


async def test_progress_is_streamed_bounded_and_cut(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(call_turn(("call_c", "chatty", "{}")), answer_turn("Done."))
    agents = {"talk": agent(toolConfig=tools("chatty"))}
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        gateway.app.tools.register(BackendTool(definition("chatty"), chatty))
        events = await gateway.query("talk", "Go")

    assert_invariants(events)
    progress = [e.tool_progress for e in events if e.type == "tool.progress"]
    assert len(progress) == MAX_EVENTS + 1  # the cap, and the note that says so
    first, second = progress[0], progress[1]
    assert first.message == "x" * MAX_MESSAGE_CHARS + "… (cut)"
    assert (first.HasField("progress"), first.progress, first.HasField("total")) == (True, 0, False)
    assert (second.message, second.HasField("progress"), second.total) == ("", False, 2)
    assert [p.message for p in progress[2:4]] == ["line 0", "line 1"]
    assert (progress[-2].message, progress[-1].message) == (f"line {MAX_EVENTS - 3}", CUT_NOTE)
    assert {p.tool_id for p in progress} == {"call_c"}
    # the model reads the result only, never the progress
    assert result_of(events[kinds(events).index("tool.result")]) == "said a lot"
    tool_message = provider.requests[1]["messages"][-1]
    assert tool_message["content"] == "said a lot"
