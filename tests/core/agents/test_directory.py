"""The generic watched directory, with the agent loader and the tool-file loader."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from service.core.agents.definition import AgentDefinition
from service.core.agents.directory import DirectoryChange, DirectoryRegistry
from service.core.agents.registry import AgentFiles
from service.core.tools.definitions import ToolDefinition
from service.core.tools.sources import ToolFileKind

WAIT_S = 10.0


def write(directory: Path, name: str, content: Any) -> Path:
    """Write a file atomically, its mtime later than the file it replaces (see the agent tests)."""
    text = content if isinstance(content, str) else json.dumps(content)
    path = directory / name
    temp = directory / f".{name}.tmp"
    temp.write_text(text, encoding="utf-8")
    if path.exists():
        mtime = max(temp.stat().st_mtime_ns, path.stat().st_mtime_ns + 1_000_000_000)
        os.utime(temp, ns=(mtime, mtime))
    os.replace(temp, path)
    return path


def agent(prompt: str) -> dict[str, Any]:
    return {"mode": "ONESHOT", "plain": {"systemPrompt": prompt}}


def tools(*names: str, description: str = "A tool.") -> dict[str, Any]:
    return {"tools": [{"name": name, "description": description} for name in names]}


def prompt(agents: DirectoryRegistry[AgentDefinition], key: str) -> str:
    return agents.items[key].stage("plain").system_prompt


# -- one item per file: agents ------------------------------------------------------------


def test_agent_files_keep_their_last_valid_version_until_fixed_or_removed(tmp_path: Path) -> None:
    changes: list[DirectoryChange] = []
    agents = DirectoryRegistry(tmp_path, AgentFiles(), on_change=changes.append)
    write(tmp_path, "a.json", agent("one"))
    write(tmp_path, "b.json", agent("two"))
    (tmp_path / "notes.txt").write_text("not an agent")
    assert agents.load_all() == DirectoryChange(1, added=("a", "b"))
    assert [a.key for a in agents.list()] == ["a", "b"]

    write(tmp_path, "a.json", '{"mode": "ONESHOT",')
    assert agents.load_all() == DirectoryChange(2, failed=("a.json",))
    assert prompt(agents, "a") == "one"
    assert agents.errors == {
        "a.json": "a.json: line 1, column 20: invalid JSON: Expecting property name "
        "enclosed in double quotes"
    }
    assert agents.load_all() is None and agents.version == 2

    write(tmp_path, "a.json", agent("three"))
    assert agents.load_all() == DirectoryChange(3, updated=("a",), cleared=("a.json",))
    assert prompt(agents, "a") == "three" and agents.errors == {}

    (tmp_path / "b.json").unlink()
    assert agents.load_all() == DirectoryChange(4, removed=("b",))
    assert list(agents.items) == ["a"]
    assert changes == [
        DirectoryChange(1, added=("a", "b")),
        DirectoryChange(2, failed=("a.json",)),
        DirectoryChange(3, updated=("a",), cleared=("a.json",)),
        DirectoryChange(4, removed=("b",)),
    ]


def test_a_broken_new_file_is_not_loaded_and_its_removal_clears_the_error(tmp_path: Path) -> None:
    agents = DirectoryRegistry(tmp_path, AgentFiles())
    write(tmp_path, "bad.json", {"mode": "ONESHOT", "plain": {"systemPrompt": ""}})
    assert agents.load_all() == DirectoryChange(1, failed=("bad.json",))
    assert agents.items == {}
    assert agents.errors == {"bad.json": "bad.json: plain.systemPrompt: must not be empty"}
    (tmp_path / "bad.json").unlink()
    assert agents.load_all() == DirectoryChange(2, cleared=("bad.json",))
    assert agents.errors == {}


# -- several items per file, combined across files: tools ------------------------------


def test_tool_files_yield_several_tools_and_conflicts_are_reported_per_file(
    tmp_path: Path,
) -> None:
    write(tmp_path, "a.action", tools("theme"))
    write(tmp_path, "b.html", tools("theme", "pick"))
    files: DirectoryRegistry[ToolDefinition] = DirectoryRegistry(tmp_path, ToolFileKind())
    assert files.load_all() == DirectoryChange(1, added=("pick", "theme"), failed=("b.html",))
    assert [(t.name, t.kind, t.source) for t in files.list()] == [
        ("pick", "frontend", "b.html"),
        ("theme", "action", "a.action"),
    ]
    assert files.errors == {"b.html": "b.html: 'theme': already defined in a.action"}

    write(tmp_path, "a.action", "{ broken")  # the last valid a.action keeps its name
    assert files.load_all() == DirectoryChange(2, failed=("a.action",))
    assert files.items["theme"].source == "a.action"
    assert files.errors == {
        "a.action": "a.action: invalid JSON: Expecting property name enclosed in double "
        "quotes (at line 1, column 3)",
        "b.html": "b.html: 'theme': already defined in a.action",
    }

    (tmp_path / "a.action").unlink()  # now b.html's theme is the first one
    assert files.load_all() == DirectoryChange(
        3, updated=("theme",), cleared=("a.action", "b.html")
    )
    theme = files.items["theme"]
    assert (theme.kind, theme.source, files.errors) == ("frontend", "b.html", {})


async def test_wait_for_version_and_the_real_watcher(tmp_path: Path) -> None:
    files: DirectoryRegistry[ToolDefinition] = DirectoryRegistry(tmp_path, ToolFileKind())
    assert await files.wait_for_version(0, timeout=0) == 0
    with pytest.raises(TimeoutError):
        await files.wait_for_version(1, timeout=0.01)
    stop = asyncio.Event()
    watch = asyncio.create_task(
        files.watch(stop, force_polling=True, poll_delay_ms=20, step_ms=20, debounce_ms=50)
    )
    try:
        write(tmp_path, "ui.action", tools("theme", "font"))
        await files.wait_for_version(1, timeout=WAIT_S)
        assert list(files.items) == ["theme", "font"]  # in file order
        write(tmp_path, "ui.action", tools("theme"))
        await files.wait_for_version(2, timeout=WAIT_S)
        assert list(files.items) == ["theme"]
    finally:
        stop.set()
        await asyncio.wait_for(watch, WAIT_S)


def test_a_change_reads_plainly_in_the_log() -> None:
    assert DirectoryChange(1, added=("a", "b")).describe() == "added a, b"
    change = DirectoryChange(
        3, updated=("a",), removed=("c",), failed=("d.json",), cleared=("a.json",)
    )
    assert change.describe() == "updated a; removed c; failed d.json; fixed a.json"
    assert DirectoryChange(4).describe() == "nothing"
