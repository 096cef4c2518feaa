"""`scripts/query.py`, run as a subprocess against the real service in-process."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from service.providers.loopback import DONE, LoopbackProvider, content, finish, usage
from service.testing import Harness

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "query.py"


async def query(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SCRIPT),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_events_print_as_compact_json_with_numbers_as_numbers(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue([content("Hi"), finish("stop"), usage(12, 5, reasoning_tokens=2), DONE])
    target = f"127.0.0.1:{gateway.app.grpc.port}"
    code, out, err = await query("plain", "Hello", "--target", target)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert [line.split(" ", 2)[:2] for line in lines] == [
        ["1", "request.query"],
        ["2", "chat.start"],
        ["3", "run.start"],
        ["4", "content.start"],
        ["5", "content.delta"],
        ["6", "content.end"],
        ["7", "run.complete"],
    ]
    assert lines[1] == '2 chat.start {"chatName":"Hello"}'
    assert lines[-1] == (
        '7 run.complete {"finishReason":"stop","usage":'
        '{"promptTokens":12,"completionTokens":5,"totalTokens":17,"reasoningTokens":2}}'
    )
    query_line = json.loads(lines[0].split(" ", 2)[2])
    assert (query_line["message"], query_line["agentKey"]) == ("Hello", "plain")


async def test_the_target_comes_from_agw_target(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue([content("Hi"), finish("stop"), DONE])
    env = {"AGW_TARGET": f"127.0.0.1:{gateway.app.grpc.port}"}
    code, out, err = await query("plain", "Hello", env=env)
    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == '7 run.complete {"finishReason":"stop"}'


async def test_failures_say_why_in_one_line(gateway: Harness) -> None:
    code, out, err = await query("plain", "Hello", "--target", "127.0.0.1:1")
    assert (code, out) == (1, "")
    assert err == "error: cannot reach agw at 127.0.0.1:1 (is it running? `make run`)\n"
    target = f"127.0.0.1:{gateway.app.grpc.port}"
    code, out, err = await query("nope", "Hello", "--target", target)
    assert (code, out) == (1, "")
    assert err.startswith("error: NOT_FOUND: unknown agent 'nope'")
