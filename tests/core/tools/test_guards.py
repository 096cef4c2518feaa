"""Doom-loop detection and output truncation, alone and in a REACT run."""

from __future__ import annotations

from pathlib import Path

from service.core.tools.guards import (
    MAX_LINE_CHARS,
    MAX_OUTPUT_BYTES,
    LoopDetector,
    identity,
    truncate_output,
)
from service.providers.loopback import LoopbackProvider
from tests.core.tools.kit import (
    Probe,
    agent,
    answer_turn,
    assert_invariants,
    call_turn,
    result_of,
    tool_gateway,
    tools,
)


def test_the_third_identical_call_in_the_window_is_a_loop() -> None:
    detector = LoopDetector(window=4, repeats=3)
    assert detector.check(identity("t", '{"a": 1, "b": 2}')) == 0
    assert detector.check(identity("t", '{"b":2,"a":1}')) == 0  # same arguments, other spelling
    assert detector.check(identity("t", '{"a": 1, "b": 2}')) == 3
    assert detector.check(identity("t", '{"a": 2}')) == 0
    for _ in range(4):
        detector.check(identity("other", "{}"))
    assert (
        detector.check(identity("t", '{"a": 1, "b": 2}')) == 0
    )  # the earlier ones left the window


def test_output_is_bounded_with_a_note() -> None:
    assert truncate_output("short") == "short"
    assert truncate_output({"a": 1}) == {"a": 1}
    long_line = truncate_output("x" * (MAX_LINE_CHARS + 10))
    assert long_line.startswith("x" * MAX_LINE_CHARS) and "line cut" in long_line
    flood = truncate_output("y\n" * MAX_OUTPUT_BYTES)
    assert len(flood.encode()) < MAX_OUTPUT_BYTES + 200 and "output cut" in flood
    big = truncate_output({"data": "z" * (MAX_OUTPUT_BYTES * 2)})
    assert isinstance(big, str) and len(big.encode()) < MAX_OUTPUT_BYTES and "cut" in big


async def test_a_repeated_call_is_refused_and_the_run_goes_on(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    same = ("echo", '{"text":"again"}')
    provider.enqueue(
        call_turn(("c1", *same)),
        call_turn(("c2", *same)),
        call_turn(("c3", *same)),
        answer_turn("I will stop."),
    )
    agents = {"r": agent("REACT", toolConfig=tools("echo"))}
    async with tool_gateway(tmp_path, provider, agents, Probe()) as gateway:
        events = await gateway.query("r", "Echo forever")
    assert_invariants(events)
    loops = [e for e in events if e.type == "loop.detect"]
    assert len(loops) == 1
    assert (loops[0].loop_detect.tool_name, loops[0].loop_detect.repeat_count) == ("echo", 3)
    results = [e for e in events if e.type == "tool.result"]
    assert [r.tool_result.error for r in results] == [False, False, True]
    assert "already called 2 times" in str(result_of(results[2]))
    assert events[-1].type == "run.complete"
    assert "already called" in provider.requests[3]["messages"][-1]["content"]
