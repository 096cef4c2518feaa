"""The `agw` command at a terminal: a spinner until the run shows something, friendly names
for the service's own tools, a table that fits 80 columns, nothing of the run after Ctrl-C.

The command runs as a subprocess: on a pseudo-terminal where the terminal matters, against
the real service in-process, or a scripted gateway where the timing must be exact.
"""

from __future__ import annotations

import asyncio
import os
import pty
import signal
import sys
from pathlib import Path
from typing import Any

import grpc
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc

from service.providers.loopback import DONE, Gate, LoopbackProvider, content, finish
from service.testing import Harness, oneshot_agent, serve_gateway, write_agent
from tests.clients.conftest import start_agw
from tests.clients.test_cli import Agw, read_until

ROOT = Path(__file__).resolve().parents[2]
Context = grpc.aio.ServicerContext[Any, Any]


async def read_all(fd: int, until_exit: asyncio.subprocess.Process) -> bytes:
    """What the terminal `fd` shows until the process exits (and its last output)."""
    loop = asyncio.get_running_loop()
    seen = b""
    while True:
        try:
            chunk = await asyncio.wait_for(loop.run_in_executor(None, os.read, fd, 4096), 30)
        except OSError:  # the terminal closed with the process
            return seen
        if not chunk:
            return seen
        seen += chunk


async def test_a_spinner_turns_on_a_terminal_until_the_run_shows_something(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue([Gate(gate), content("Hello"), finish("stop"), DONE])
    controller, terminal = pty.openpty()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "agw_client", "query", "plain", "Hi"),
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env={**Agw(gateway).env},
    )
    os.close(terminal)
    try:
        loop = asyncio.get_running_loop()
        shown = b""
        while shown.count(b"waiting for agw") < 2:  # turning: drawn again and again
            chunk = await asyncio.wait_for(
                loop.run_in_executor(None, os.read, controller, 4096), 30
            )
            shown += chunk
        assert b"Hello" not in shown
        gate.set()
        shown += await read_all(controller, process)
        assert await process.wait() == 0
    finally:
        os.close(controller)
    text = shown.decode()
    frames = text[: text.index("Hello")]
    assert "\r| waiting for agw…" in frames and "\r/ waiting for agw…" in frames
    assert frames.endswith("\r\x1b[K")  # erased before the answer: the line is clean
    assert "waiting" not in text[text.index("Hello") :]
    assert text.endswith("Hello\r\n")  # the terminal's newline


async def test_no_spinner_when_the_output_is_not_a_terminal(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue([Gate(gate), content("Hello"), finish("stop"), DONE])
    run = asyncio.create_task(Agw(gateway)("query", "plain", "Hi"))
    await asyncio.sleep(0.5)  # the spinner would have turned by now
    gate.set()
    assert await run == (0, "Hello\n", "")


async def test_the_service_s_own_tools_go_by_friendly_names(tmp_path: Path) -> None:
    async with Harness.start(
        ROOT / "agents", None, tools_dir=ROOT / "tools", data_dir=tmp_path, demo_delay_ms=0
    ) as demo:
        code, out, err = await Agw(demo)("query", "demo_plan", "Plan a day in Lyon")
    assert (code, err) == (0, "")
    assert "_plan_" not in out
    lines = out.splitlines()
    assert "→ plan" in lines and lines.count("→ task report") == 2
    assert '→ city_datetime {"city": "Lyon"}' in lines  # ordinary tools as they are
    assert not [line for line in lines if line.startswith("← plan")]  # the plan says it


async def test_agents_fit_80_columns(tmp_path: Path, provider: LoopbackProvider) -> None:
    agents = tmp_path / "agents"
    long = "A description that goes on and on, well past what one terminal line holds at all."
    write_agent(
        agents,
        "helper",
        oneshot_agent("H.", name="Helper with a long display name, really", description=long),
    )
    write_agent(agents, "x", oneshot_agent("X.", name="X", description="Short."))
    async with Harness.start(agents, provider) as gateway:
        agw = Agw(gateway)
        agw.env["COLUMNS"] = "80"
        code, out, err = await agw("agents")
        agw.env["COLUMNS"] = "200"
        _, wide, _ = await agw("agents")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert max(len(line) for line in lines) == 80
    assert lines[1].startswith("helper  ONESHOT  Helper with a long display") and lines[1].endswith(
        "…"
    )
    assert lines[2].startswith("x       ONESHOT  X ") and lines[2].endswith("  Short.")
    assert long in wide  # a wider terminal shows it whole


class LateGateway(gateway_pb2_grpc.AgentGatewayServicer):
    """Streams some answer, and more of it after the Cancel came, then `run.cancel`."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def Query(self, request: Any, context: Context) -> None:  # type: ignore[override]
        async def send(seq: int, **payload: Any) -> None:
            await context.write(pb.Event(seq=seq, run_id="r1", chat_id="c1", **payload))

        await send(1, content_start=pb.ContentStart(content_id="r1_c_1"))
        await send(2, content_delta=pb.ContentDelta(content_id="r1_c_1", delta="so far"))
        await self.cancelled.wait()
        await send(3, content_delta=pb.ContentDelta(content_id="r1_c_1", delta=" and then"))
        await send(4, content_end=pb.ContentEnd(content_id="r1_c_1"))
        await send(5, run_cancel=pb.RunCancel(reason="cancel"))

    async def Cancel(self, request: gw.CancelRequest, context: Context) -> gw.CancelResponse:
        self.cancelled.set()
        return gw.CancelResponse(cancelled=True)


async def test_after_ctrl_c_nothing_of_the_run_is_printed_but_its_end() -> None:
    servicer = LateGateway()  # type: ignore[abstract]
    async with serve_gateway(servicer) as target:
        process = await start_agw(target, "query", "any", "Hi")
        assert process.stdout is not None
        shown = await read_until(process.stdout, "so far")
        process.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 130
    assert shown + out.decode() == "so far\n"  # the line ended, and no " and then" after it
    assert err.decode().splitlines() == [
        "cancelling… (Ctrl-C again to leave at once)",
        "cancelled (cancel)",
    ]
