"""The tool registry: built-ins and files, hot reload, and each stage's exact tool set."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from service.builtins.city_datetime import city_datetime_tool
from service.core.agents.loader import parse_agent_text
from service.core.tools.definitions import ToolNotFound
from service.core.tools.registry import HINTS_HEADING, ToolRegistry
from tests.core.tools.kit import Probe


def write(directory: Path, name: str, *tools: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(json.dumps({"tools": list(tools)}))
    return path


def tool(name: str, description: str = "A tool.", **extra: Any) -> dict[str, Any]:
    return {"name": name, "description": description, **extra}


def registry(directory: Path) -> ToolRegistry:
    tools = ToolRegistry(directory, builtin=[city_datetime_tool(), *Probe().tools()[:1]])
    tools.load_all()
    return tools


def stage_of(definition: dict[str, Any], stage: str) -> Any:
    return parse_agent_text(json.dumps(definition), key="a").stage(stage)  # type: ignore[arg-type]


def test_built_ins_and_files(tmp_path: Path) -> None:
    write(tmp_path, "ui.action", tool("theme"))
    write(tmp_path, "card.qlc", tool("card"))
    write(tmp_path, "city.backend", tool("city_datetime", "Local time.", after_call_hint="Quote."))
    (tmp_path / "notes.txt").write_text("not a tool file")
    tools = registry(tmp_path)
    assert tools.errors == {}
    assert [(t.name, t.kind, t.source) for t in tools.list()] == [
        ("card", "frontend", "card.qlc"),
        ("city_datetime", "backend", "city.backend"),
        ("echo", "backend", "built-in"),
        ("theme", "action", "ui.action"),
    ]
    redefined = tools.get("city_datetime")
    assert redefined is not None and redefined.description == "Local time."
    assert redefined.timeout_s == 5.0  # kept from the built-in
    assert tools.handler("city_datetime") is not None  # the built-in implementation
    assert tools.handler("theme") is None


def test_conflicts_are_reported_and_the_first_definition_kept(tmp_path: Path) -> None:
    write(tmp_path, "a.action", tool("theme"))
    write(tmp_path, "b.html", tool("theme"), tool("echo"), tool("ok"))
    write(tmp_path, "c.backend", tool("unknown_backend"), tool("_plan_add_tasks_"))
    tools = registry(tmp_path)
    assert tools.errors == {
        "b.html": "b.html: 'theme': already defined in a.action; 'echo': is a built-in backend "
        "tool; only a .backend file may redefine it",
        "c.backend": "c.backend: 'unknown_backend': no such built-in backend tool (a .backend "
        "file can only describe built-ins); '_plan_add_tasks_': is a planning tool of "
        "PLAN_EXECUTE and cannot be redefined",
    }
    assert [t.name for t in tools.list()] == ["city_datetime", "echo", "ok", "theme"]
    assert tools.get("theme").source == "a.action"  # type: ignore[union-attr]


def test_stage_tools_follow_the_agent_config(tmp_path: Path) -> None:
    write(tmp_path, "ui.action", tool("theme"))
    write(tmp_path, "pick.html", tool("pick", after_call_hint="Respect the pick."))
    tools = registry(tmp_path)
    config = {"backends": ["echo"], "frontends": ["pick"], "actions": ["theme"]}
    agent = {
        "mode": "PLAN_EXECUTE",
        "toolConfig": config,
        "planExecute": {
            "plan": {"systemPrompt": "P"},
            "execute": {"systemPrompt": "E", "toolConfig": {"backends": ["city_datetime"]}},
            "summary": {"systemPrompt": "S", "toolConfig": None},
        },
    }
    plan = tools.for_stage(stage_of(agent, "plan"))
    assert [t.name for t in plan.ordinary] == ["echo", "pick", "theme"]
    assert [t.name for t in plan.planning] == ["_plan_add_tasks_"]
    execute = tools.for_stage(stage_of(agent, "execute"))
    assert list(execute.by_name) == ["city_datetime", "_plan_update_task_"]
    assert tools.for_stage(stage_of(agent, "summary")).by_name == {}
    disallowed = tools.for_stage(stage_of(agent, "plan"), "DISALLOW")
    assert (disallowed.ordinary, list(disallowed.by_name)) == ((), ["_plan_add_tasks_"])
    assert [s["function"]["name"] for s in plan.schemas(planning=False)] == [
        "echo",
        "pick",
        "theme",
    ]
    assert plan.system_prompt("Base.") == (
        f"Base.\n\n{HINTS_HEADING}\n- echo: Quote the echo.\n- pick: Respect the pick."
    )


def test_unknown_or_wrong_kind_tools_are_refused(tmp_path: Path) -> None:
    tools = registry(tmp_path)
    agent = {
        "mode": "ONESHOT",
        "plain": {"systemPrompt": "P"},
        "toolConfig": {"backends": ["ghost"], "actions": ["echo"]},
    }
    with pytest.raises(ToolNotFound) as caught:
        tools.for_stage(stage_of(agent, "plain"))
    assert str(caught.value) == (  # one sentence: what is wrong, not every tool there is
        "stage 'plain': backends: 'ghost' is not defined; actions: 'echo' is a backend tool"
    )
    assert caught.value.reason == "TOOL_NOT_FOUND"


def test_a_broken_edit_keeps_the_last_valid_version(tmp_path: Path) -> None:
    path = write(tmp_path, "ui.action", tool("theme"))
    tools = registry(tmp_path)
    version = tools.version
    path.write_text("{ broken")
    change = tools.load_all()
    assert change is not None and change.failed == ("ui.action",)
    assert tools.get("theme") is not None
    assert "ui.action: invalid JSON" in tools.errors["ui.action"]
    path.write_text(json.dumps({"tools": [tool("theme", "Changed.")]}))
    change = tools.load_all()
    assert change is not None and (change.updated, change.cleared) == (("theme",), ("ui.action",))
    assert tools.errors == {} and tools.version == version + 2
    path.unlink()
    change = tools.load_all()
    assert change is not None and change.removed == ("theme",)
    assert tools.load_all() is None


async def test_the_directory_is_watched(tmp_path: Path) -> None:
    tools = registry(tmp_path)
    stop = asyncio.Event()
    watch = asyncio.create_task(
        tools.watch(stop, force_polling=True, poll_delay_ms=20, debounce_ms=50)
    )
    try:
        version = tools.version
        write(tmp_path, "new.action", tool("fireworks"))
        await tools.wait_for_version(version + 1, timeout=5)
        assert tools.get("fireworks") is not None
    finally:
        stop.set()
        await asyncio.wait_for(watch, 5)


async def test_a_changed_view_file_reloads_the_tools_that_name_it(tmp_path: Path) -> None:
    views = tmp_path / "views"
    views.mkdir()
    view = views / "card.html"
    view.write_text("<p>one</p>")
    (views / "unused.html").write_text("<p>not named</p>")
    write(tmp_path, "ui.html", tool("card", view="views/card.html"))
    write(tmp_path, "more.html", tool("badge", view="./views/../views/card.html"))
    tools = registry(tmp_path)
    assert tools.errors == {}  # a view is not taken for a tool file of its own
    assert tools.files is not None
    assert tools.files.entries_of(view) == {"ui.html", "more.html"}
    assert tools.files.entries_of(views / "unused.html") == set()

    def views_now() -> tuple[str, str]:
        card, badge = tools.get("card"), tools.get("badge")
        assert card is not None and badge is not None
        return card.view_html, badge.view_html

    stop = asyncio.Event()
    watch = asyncio.create_task(
        tools.watch(stop, force_polling=True, poll_delay_ms=20, debounce_ms=50)
    )
    try:
        version = tools.version
        view.write_text("<p>two</p>")
        await tools.wait_for_version(version + 1, timeout=5)
        assert views_now() == ("<p>two</p>", "<p>two</p>")
        assert tools.version == version + 1  # one reload for both files

        # A view gone: both files report it and keep their last valid version.
        view.unlink()
        await tools.wait_for_version(version + 2, timeout=5)
        assert sorted(tools.errors) == ["more.html", "ui.html"]
        assert "cannot read" in tools.errors["ui.html"]
        assert views_now() == ("<p>two</p>", "<p>two</p>")

        # Back again: the errors clear and the new view serves.
        view.write_text("<p>three</p>")
        await tools.wait_for_version(version + 3, timeout=5)
        assert tools.errors == {}
        assert views_now() == ("<p>three</p>", "<p>three</p>")
    finally:
        stop.set()
        await asyncio.wait_for(watch, 5)


def test_a_stage_keeps_its_tools_until_a_source_changes(tmp_path: Path) -> None:
    path = write(tmp_path, "ui.action", tool("theme", "Old."))
    tools = registry(tmp_path)
    stage = stage_of(
        {"mode": "ONESHOT", "plain": {"systemPrompt": "P"}, "toolConfig": {"actions": ["theme"]}},
        "plain",
    )
    first = tools.for_stage(stage)
    assert tools.for_stage(stage) is first  # checked at the query, asked again by the run
    assert tools.for_stage(stage, "DISALLOW") is not first
    path.write_text(json.dumps({"tools": [tool("theme", "New.")]}))
    tools.load_all()
    again = tools.for_stage(stage)
    assert again is not first and again.by_name["theme"].description == "New."
