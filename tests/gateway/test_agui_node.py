"""The AG-UI endpoint driven by the official `@ag-ui/client` (Node), against the real service."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

from service.providers.loopback import DONE, HttpError, LoopbackProvider, content, finish, reasoning
from service.testing import Harness, write_agent
from tests.core.modes.test_plan_execute import add_tasks, report
from tests.core.tools.kit import agent, call_turn, tools, write_ui_tools

NODE_DIR = Path(__file__).resolve().parents[2] / "clients" / "node"


async def test_http_agent_of_ag_ui_client(tmp_path: Path, provider: LoopbackProvider) -> None:
    node = shutil.which("node")
    assert node, "Node.js is needed for the AG-UI client's tests"
    assert (NODE_DIR / "node_modules" / "@ag-ui" / "client").is_dir(), "run `make install`"

    reported: list[int] = []

    def respond(body: dict[str, Any]) -> list[Any]:
        last = body["messages"][-1]
        offered = {tool["function"]["name"] for tool in body.get("tools", [])}
        if "show_map" in offered:  # the client's own tool: call it, then say what it did
            if last["role"] == "tool":
                return [content(f"The map shows {last['content']}."), finish("stop"), DONE]
            return call_turn(("m1", "show_map", '{"city": "Oslo"}'))
        if last["role"] == "tool" and "pick" in offered:
            return [content("You picked "), content(f"{last['content']}."), finish("stop"), DONE]
        if last["content"] == "fail":
            return [HttpError(500, {"error": {"message": "boom"}})]
        if last["role"] == "tool":
            return [content(f"You chose {last['content']}."), finish("stop"), DONE]
        if "_plan_add_tasks_" in offered:
            return add_tasks("p1", "Greet", "Wave")
        if "_plan_update_task_" in offered:
            reported.append(len(reported) + 1)
            task = f"task_{len(reported)}"
            return report(f"u_{task}", task, "completed", "done")
        if "ask_user" in offered:
            question = {"question": "Which color?", "options": ["red", "blue"]}
            return call_turn(("q1", "ask_user", json.dumps(question)))
        if "pick" in offered:
            return call_turn(("f1", "pick", '{"options":["a","b"]}'))
        return [reasoning("Hm."), content("Hel"), content("lo"), finish("stop"), DONE]

    provider.responder = respond
    agents = tmp_path / "agents"
    write_agent(agents, "plain", agent(modelConfig={"reasoning": {"enabled": True}}))
    write_agent(agents, "planner", agent("PLAN_EXECUTE", toolConfig=tools()))
    write_agent(agents, "asker", agent("REACT", toolConfig=tools("ask_user")))
    write_agent(agents, "picker", agent(toolConfig=tools(frontends=("pick",))))
    write_agent(agents, "copilot", agent(clientTools=True))
    tools_dir = write_ui_tools(tmp_path / "tools")
    async with Harness.start(agents, provider, tools_dir=tools_dir) as service:
        process = await asyncio.create_subprocess_exec(
            node,
            "--test",
            "--test-reporter=tap",
            "agui-test/",
            cwd=NODE_DIR,
            env={**os.environ, "AGW_HTTP_URL": service.http_url},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(process.communicate(), 60)
    tap = out.decode()
    assert process.returncode == 0, tap
    assert "# pass 9" in tap and "# fail 0" in tap, tap
