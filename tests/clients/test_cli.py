"""The `agw` command line, run as a subprocess against the real service in-process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from service.providers.loopback import (
    DONE,
    Gate,
    HttpError,
    LoopbackProvider,
    ScriptItem,
    content,
    finish,
    reasoning,
    tool_call,
)
from service.testing import Harness

ANSWER: list[ScriptItem] = [content("Hel"), content("lo"), finish("stop"), DONE]


class Agw:
    """Runs `python -m agw_client` (the `agw` command) against one gateway."""

    def __init__(self, gateway: Harness) -> None:
        self.target = f"127.0.0.1:{gateway.app.grpc.port}"
        self.env = {**os.environ, "NO_COLOR": "1", "AGW_TARGET": self.target}

    async def start(self, *args: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agw_client",
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
        )

    async def __call__(self, *args: str, stdin: str = "") -> tuple[int, str, str]:
        process = await self.start(*args)
        out, err = await asyncio.wait_for(process.communicate(stdin.encode()), 60)
        assert process.returncode is not None
        return process.returncode, out.decode(), err.decode()


async def read_until(stream: asyncio.StreamReader, needle: str) -> str:
    seen = ""
    while needle not in seen:
        chunk = await asyncio.wait_for(stream.read(1024), 30)
        assert chunk, f"output ended before {needle!r}: {seen!r}"
        seen += chunk.decode()
    return seen


def test_agw_command_is_installed() -> None:
    assert (Path(sys.executable).parent / "agw").exists()


async def test_agents_table(gateway: Harness) -> None:
    code, out, err = await Agw(gateway)("agents")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "KEY      MODE     NAME     DESCRIPTION",
        "plain    ONESHOT  plain",
        "thinker  ONESHOT  thinker",
    ]


async def test_agents_as_json(gateway: Harness) -> None:
    code, out, _ = await Agw(gateway)("agents", "--json")
    assert code == 0
    assert [json.loads(line)["key"] for line in out.splitlines()] == ["plain", "thinker"]


async def test_query_streams_reasoning_and_answer(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue([reasoning("Let me"), reasoning(" think."), *ANSWER])
    code, out, err = await Agw(gateway)("query", "thinker", "Why?")
    assert (code, out, err) == (0, "[thinking] Let me think.\nHello\n", "")
    assert provider.requests[0]["messages"][-1] == {"role": "user", "content": "Why?"}


async def test_query_reasoning_is_dimmed_with_colors(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue([reasoning("Hm"), *ANSWER])
    code, out, _ = await Agw(gateway)("query", "thinker", "Why?", "--color", "always")
    assert code == 0
    assert out == "\x1b[2m[thinking] \x1b[0m\x1b[2mHm\x1b[0m\nHello\n"


async def test_query_json_lines(gateway: Harness, provider: LoopbackProvider) -> None:
    provider.enqueue(ANSWER)
    code, out, err = await Agw(gateway)("query", "plain", "Hi", "--json")
    assert (code, err) == (0, "")
    events = [json.loads(line) for line in out.splitlines()]
    assert [(e["seq"], e["type"]) for e in events] == [
        (1, "request.query"),
        (2, "chat.start"),
        (3, "run.start"),
        (4, "content.start"),
        (5, "content.delta"),
        (6, "content.delta"),
        (7, "content.end"),
        (8, "run.complete"),
    ]
    assert events[0]["message"] == "Hi" and events[0]["agentKey"] == "plain"
    assert [e["delta"] for e in events[4:6]] == ["Hel", "lo"]
    assert events[-1]["finishReason"] == "stop"


async def test_query_of_unknown_agent_fails_with_the_status(gateway: Harness) -> None:
    code, out, err = await Agw(gateway)("query", "nope", "Hi")
    assert (code, out) == (1, "")
    assert err.startswith("agw: NOT_FOUND: ")
    assert err.rstrip().endswith("(AGENT_NOT_FOUND)")


async def test_query_in_a_mode_the_agent_does_not_allow_fails(gateway: Harness) -> None:
    code, out, err = await Agw(gateway)("query", "plain", "Hi", "--mode", "PLAN_EXECUTE")
    assert (code, out) == (1, "")
    assert err.startswith("agw: INVALID_ARGUMENT: agent 'plain' does not run in mode PLAN_EXECUTE")
    assert err.rstrip().endswith("(INVALID_REQUEST)")


async def test_failed_run_exits_1_with_its_reason(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue([HttpError(500, {"error": {"message": "upstream exploded"}})])
    code, out, err = await Agw(gateway)("query", "plain", "Hi")
    assert (code, out) == (1, "")
    assert err.startswith("error: PROVIDER_ERROR: ")
    assert "upstream exploded" in err


async def test_unreachable_gateway_says_so_in_one_line(gateway: Harness) -> None:
    agw = Agw(gateway)
    hint = "agw: cannot reach agw at 127.0.0.1:1 (is it running? `make run`)\n"
    for command in (("agents",), ("query", "plain", "Hi"), ("chat-history", "c1")):
        code, out, err = await agw(*command, "--target", "127.0.0.1:1", "--timeout", "2")
        assert (code, out, err) == (1, "", hint)


async def test_a_refusal_while_draining_is_not_taken_for_an_unreachable_gateway(
    gateway: Harness,
) -> None:
    await gateway.app.frontdoor.drain(0)  # now UNAVAILABLE, with the reason SHUTTING_DOWN
    # the query is sent again once (another replica may take it), then the refusal shown
    code, out, err = await Agw(gateway)("query", "plain", "Hi", "--reattach-attempts", "1")
    assert (code, out) == (1, "")
    assert err.startswith("agw: UNAVAILABLE: the service is shutting down")
    assert err.endswith("(SHUTTING_DOWN)\n")


async def test_chat_keeps_the_chat_across_turns(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(ANSWER, [content("Again!"), finish("stop"), DONE])
    code, out, err = await Agw(gateway)("chat", "plain", stdin="Hi\n\nOnce more\n")
    assert code == 0
    assert out == "you> Hi\nHello\nyou> \nyou> Once more\nAgain!\nyou> \n"
    second = provider.requests[1]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    lines = err.splitlines()
    assert lines[0] == "chat with plain: Ctrl-C cancels a run, Ctrl-D leaves"
    chat_id = lines[1].split()[1].rstrip(":")
    assert lines[1] == f"chat {chat_id}: agw chat plain --chat {chat_id}"
    assert len(gateway.app.frontdoor.runs) == 2
    assert {run.chat_id for run in gateway.app.frontdoor.runs.values()} == {chat_id}


async def test_ctrl_c_cancels_the_run(gateway: Harness, provider: LoopbackProvider) -> None:
    gate = asyncio.Event()
    provider.enqueue([content("so far"), Gate(gate), content("never"), finish("stop"), DONE])
    process = await Agw(gateway).start("query", "plain", "go")
    assert process.stdout is not None and process.stderr is not None
    shown = await read_until(process.stdout, "so far")
    process.send_signal(signal.SIGINT)
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 130
    assert shown + out.decode() == "so far\n"
    assert err.decode().splitlines() == [
        "cancelling… (Ctrl-C again to leave at once)",
        "cancelled (cancel)",
    ]
    (run,) = gateway.app.frontdoor.runs.values()
    assert run.log[-1].type == "run.cancel" and run.log[-1].run_cancel.reason == "cancel"


async def test_chats_and_chat_history(gateway: Harness, provider: LoopbackProvider) -> None:
    provider.enqueue([reasoning("Hm."), *ANSWER])
    agw = Agw(gateway)
    code, out, _ = await agw("query", "thinker", "Tell me")
    assert code == 0
    (run,) = gateway.app.frontdoor.runs.values()
    code, out, err = await agw("chats")
    assert (code, err) == (0, "")
    header, row = out.splitlines()
    assert header.split() == ["CHAT", "UPDATED", "RUNS", "AGENT", "NAME"]
    assert row.split()[0] == run.chat_id
    assert row.split()[-3:] == ["thinker", "Tell", "me"]
    code, out, err = await agw("chat-history", run.chat_id)
    assert (code, err) == (0, "")
    assert out == "# Tell me\nyou> Tell me\n[thinking] Hm.\nHello\n"
    code, out, _ = await agw("chat-history", run.chat_id, "--json")
    kinds = [json.loads(line)["type"] for line in out.splitlines()]
    assert kinds == [
        "request.query",
        "chat.start",
        "run.start",
        "reasoning.snapshot",
        "content.snapshot",
        "run.complete",
    ]
    code, _, err = await agw("chat-history", "no-such-chat")
    assert code == 1 and err.startswith("agw: NOT_FOUND: ")


async def test_chat_answers_a_waiting_frontend_tool(
    frontend_gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        [tool_call(0, "call_1", "pick", '{"question": "Color?"}'), finish("tool_calls"), DONE],
        [content("You chose blue"), finish("stop"), DONE],
    )
    code, out, _ = await Agw(frontend_gateway)("chat", "picker", stdin='Pick one\n"blue"\n')
    assert code == 0
    assert out.splitlines() == [
        "you> Pick one",
        '→ pick {"question": "Color?"}',
        "? pick (html) waits for your answer",
        "  Let the user pick a color and wait for the choice.",
        "  question: Color?",
        '  answer with JSON ({"key": "value"}, 42, true) or plain text',
        'your answer: "blue"',
        "← pick returned: blue",
        "You chose blue",
        "you> ",
    ]
    (run,) = frontend_gateway.app.frontdoor.runs.values()
    submitted = [e.request_submit for e in run.log if e.type == "request.submit"]
    assert [s.payload.string_value for s in submitted] == ["blue"]
    assert provider.requests[1]["messages"][-1]["role"] == "tool"
    assert "blue" in json.dumps(provider.requests[1]["messages"][-1]["content"])


async def test_actions_are_shown_by_name(
    frontend_gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        [tool_call(0, "call_1", "switch_theme", '{"theme": "dark"}'), finish("tool_calls"), DONE],
        [content("Done."), finish("stop"), DONE],
    )
    code, out, err = await Agw(frontend_gateway)("query", "picker", "Dark please")
    assert (code, err) == (0, "")
    assert out.splitlines() == ['⚡ switch_theme {"theme": "dark"}', "Done."]


async def test_a_frontend_tool_s_options_are_numbered_and_picked_by_number(
    frontend_gateway: Harness, provider: LoopbackProvider
) -> None:
    arguments = '{"question": "Color?", "options": ["red", "blue"]}'
    provider.enqueue(
        [tool_call(0, "call_1", "pick", arguments), finish("tool_calls"), DONE],
        [content("Blue it is"), finish("stop"), DONE],
    )
    code, out, err = await Agw(frontend_gateway)("query", "picker", "Pick one", stdin="\n2\n")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        '→ pick {"question": "Color?", "options": ["red", "blue"]}',
        "? pick (html) waits for your answer",
        "  Let the user pick a color and wait for the choice.",
        "  question: Color?",
        "  options:",
        "    1. red",
        "    2. blue",
        '  answer with an option\'s number, JSON ({"key": "value"}, 42, true) or plain text',
        "your answer: ",  # an empty line asks again
        "your answer: 2",
        "← pick returned: blue",
        "Blue it is",
    ]
    (run,) = frontend_gateway.app.frontdoor.runs.values()
    (submitted,) = [e.request_submit for e in run.log if e.type == "request.submit"]
    assert submitted.payload.string_value == "blue"


async def test_numbers_typed_for_a_frontend_tool_stay_integers(
    frontend_gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        [tool_call(0, "call_1", "pick", '{"question": "How many?"}'), finish("tool_calls"), DONE],
        [content("Noted."), finish("stop"), DONE],
        [tool_call(0, "call_2", "pick", '{"question": "And?"}'), finish("tool_calls"), DONE],
        [content("Noted too."), finish("stop"), DONE],
    )
    agw = Agw(frontend_gateway)
    code, out, err = await agw("query", "picker", "Count", stdin="1\n")
    assert (code, err) == (0, "")
    assert out.splitlines()[-3:] == ["your answer: 1", "← pick returned: 1", "Noted."]
    assert provider.requests[1]["messages"][-1]["content"] == "1"  # the model reads 1, not 1.0
    (run,) = frontend_gateway.app.frontdoor.runs.values()
    code, out, err = await agw(
        "query", "picker", "Again", "--chat", run.chat_id, stdin="[2, 2.5]\n"
    )
    assert (code, err) == (0, "")
    assert out.splitlines()[-2:] == ["← pick returned: [2, 2.5]", "Noted too."]
    assert provider.requests[3]["messages"][-1]["content"] == "[2, 2.5]"
    code, out, err = await agw("chat-history", run.chat_id)
    assert (code, err) == (0, "")
    assert out.endswith("\n") and not out.endswith("\n\n")
    answers = [line for line in out.splitlines() if line.startswith(("you answered", "← pick"))]
    assert answers == [
        "you answered: 1",
        "← pick returned: 1",
        "you answered: [2, 2.5]",
        "← pick returned: [2, 2.5]",
    ]
