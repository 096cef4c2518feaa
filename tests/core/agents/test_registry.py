"""The agent registry: loading a directory, and hot reload with the real watcher."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from service.core.agents.registry import AgentRegistry, RegistryChange, is_agent_file
from service.core.errors import AgentNotFound

WAIT_S = 10.0  # upper bound only: tests await the registry's version, they never sleep


def agent(prompt: str = "You help.") -> dict[str, Any]:
    return {"mode": "ONESHOT", "plain": {"systemPrompt": prompt}}


BROKEN = {"mode": "ONESHOT", "plain": {"systemPrompt": ""}}


def write(directory: Path, name: str, content: dict[str, Any] | str) -> Path:
    """Write a file atomically (temp file + rename), as editors and deploy tools do.

    The new file's mtime is made later than the old one's: a polling watcher compares
    mtimes, and two writes within one clock tick of the file system would look alike.
    """
    text = content if isinstance(content, str) else json.dumps(content)
    path = directory / name
    temp = directory / f".{name}.tmp"
    temp.write_text(text, encoding="utf-8")
    if path.exists():
        mtime = max(temp.stat().st_mtime_ns, path.stat().st_mtime_ns + 1_000_000_000)
        os.utime(temp, ns=(mtime, mtime))
    os.replace(temp, path)
    return path


def prompt_of(registry: AgentRegistry, key: str) -> str:
    return registry.get(key).stage("plain").system_prompt


# -- loading ----------------------------------------------------------------------------


def test_load_all_keeps_valid_agents_and_records_broken_files(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path, "b.json", agent("B"))
    write(tmp_path, "a.json", agent("A"))
    write(tmp_path, "bad.json", BROKEN)
    write(tmp_path, "syntax.json", '{"mode": "ONESHOT",\n  oops}')
    registry = AgentRegistry(tmp_path)

    with caplog.at_level(logging.WARNING, logger="agw.agents"):
        change = registry.load_all()
        assert registry.load_all() is None  # nothing changed: no new version, no new log

    assert change == RegistryChange(1, added=("a", "b"), failed=("bad.json", "syntax.json"))
    assert registry.version == 1
    assert [a.key for a in registry.list()] == ["a", "b"]
    assert prompt_of(registry, "a") == "A"
    assert registry.errors == {
        "bad.json": "bad.json: plain.systemPrompt: must not be empty",
        "syntax.json": "syntax.json: line 2, column 3: invalid JSON: "
        "Expecting property name enclosed in double quotes",
    }
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert {r.name for r in caplog.records if r.levelno == logging.WARNING} == {"agw.agents"}
    assert str(tmp_path / "bad.json") in warnings[0]
    assert "plain.systemPrompt: must not be empty" in warnings[0]


def test_ignores_schema_dotfiles_and_editor_temp_files(tmp_path: Path) -> None:
    for name in ["agent.schema.json", ".hidden.json", "x.json~", "#x.json#", "x.json.swp", "x.txt"]:
        (tmp_path / name).write_text("not json", encoding="utf-8")
    (tmp_path / "sub.json").mkdir()
    registry = AgentRegistry(tmp_path)
    assert registry.load_all() is None
    assert registry.list() == [] and registry.errors == {}
    assert is_agent_file(Path("ok.json")) and not is_agent_file(Path(".json"))


def test_get_lists_available_keys_and_explains_broken_files(tmp_path: Path) -> None:
    write(tmp_path, "a.json", agent())
    write(tmp_path, "z.json", agent())
    write(tmp_path, "bad.json", BROKEN)
    registry = AgentRegistry(tmp_path)
    registry.load_all()

    with pytest.raises(AgentNotFound) as caught:
        registry.get("nope")
    assert caught.value.message == "unknown agent 'nope'; available agents: a, z"
    assert caught.value.metadata == {"agent_key": "nope"}
    with pytest.raises(AgentNotFound) as caught:
        registry.get("bad")
    assert caught.value.message == (
        "agent 'bad' is not loaded, its file is invalid "
        "(bad.json: plain.systemPrompt: must not be empty); available agents: a, z"
    )
    with pytest.raises(AgentNotFound, match="available agents: none"):
        AgentRegistry(tmp_path / "missing").get("a")


def test_an_unknown_key_is_echoed_cut_short(tmp_path: Path) -> None:
    write(tmp_path, "a.json", agent())
    registry = AgentRegistry(tmp_path)
    registry.load_all()
    with pytest.raises(AgentNotFound) as caught:
        registry.get("🙂" * 3000)
    shown = "🙂" * 64 + "…"
    assert caught.value.message == f"unknown agent {shown!r}; available agents: a"
    assert caught.value.metadata == {"agent_key": shown}


def test_load_all_applies_file_rules_to_edits_and_deletes(tmp_path: Path) -> None:
    changes: list[RegistryChange] = []
    registry = AgentRegistry(tmp_path, on_change=changes.append)
    write(tmp_path, "a.json", agent("one"))
    registry.load_all()
    write(tmp_path, "a.json", BROKEN)
    registry.load_all()
    assert prompt_of(registry, "a") == "one"  # the last valid version keeps serving
    write(tmp_path, "a.json", agent("one"))
    registry.load_all()
    (tmp_path / "a.json").unlink()
    registry.load_all()
    assert changes == [
        RegistryChange(1, added=("a",)),
        RegistryChange(2, failed=("a.json",)),
        RegistryChange(3, cleared=("a.json",)),
        RegistryChange(4, removed=("a",)),
    ]


def test_a_failing_callback_does_not_break_the_registry(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def explode(change: RegistryChange) -> None:
        raise RuntimeError("boom")

    write(tmp_path, "a.json", agent())
    registry = AgentRegistry(tmp_path, on_change=explode)
    registry.load_all()
    assert registry.get("a").key == "a" and registry.version == 1
    assert "on_change callback failed" in caplog.text


async def test_wait_for_version_times_out(tmp_path: Path) -> None:
    registry = AgentRegistry(tmp_path)
    assert await registry.wait_for_version(0, timeout=0) == 0
    with pytest.raises(TimeoutError):
        await registry.wait_for_version(1, timeout=0.01)


# -- hot reload with the real watcher ---------------------------------------------------


@pytest.fixture(params=[False, True], ids=["notify", "polling"])
async def watched(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AgentRegistry]:
    registry = AgentRegistry(tmp_path)
    registry.load_all()
    stop = asyncio.Event()
    task = asyncio.create_task(
        registry.watch(stop, force_polling=request.param, step_ms=20, poll_delay_ms=20)
    )
    yield registry
    stop.set()
    await asyncio.wait_for(task, WAIT_S)


async def changed(registry: AgentRegistry, after: int) -> None:
    await registry.wait_for_version(after + 1, timeout=WAIT_S)


async def test_add_change_delete(watched: AgentRegistry) -> None:
    directory = watched.directory
    v = watched.version
    write(directory, "a.json", agent("first"))
    await changed(watched, v)
    assert prompt_of(watched, "a") == "first"

    v = watched.version
    write(directory, "a.json", agent("second"))
    await changed(watched, v)
    assert prompt_of(watched, "a") == "second"

    v = watched.version
    (directory / "a.json").unlink()
    await changed(watched, v)
    with pytest.raises(AgentNotFound):
        watched.get("a")
    assert watched.list() == [] and watched.errors == {}


async def test_broken_edit_keeps_previous_version_until_fixed(watched: AgentRegistry) -> None:
    directory = watched.directory
    v = watched.version
    write(directory, "a.json", agent("good"))
    await changed(watched, v)

    v = watched.version
    write(directory, "a.json", '{"mode": "ONESHOT", "plain": {"systemPrompt": """\nunterminated')
    await changed(watched, v)
    assert prompt_of(watched, "a") == "good"
    assert watched.errors == {
        "a.json": 'a.json: systemPrompt (at line 1, column 47): unterminated """ text'
    }

    v = watched.version
    write(directory, "a.json", agent("fixed"))
    await changed(watched, v)
    assert prompt_of(watched, "a") == "fixed" and watched.errors == {}


async def test_broken_file_does_not_disturb_others_and_is_picked_up_when_valid(
    watched: AgentRegistry,
) -> None:
    directory = watched.directory
    v = watched.version
    write(directory, "a.json", agent("A"))
    write(directory, "b.json", agent("B"))
    await watched.wait_for_version(v + 1, timeout=WAIT_S)
    while len(watched.list()) < 2:  # the two writes may arrive in one batch or in two
        await changed(watched, watched.version)

    v = watched.version
    write(directory, "c.json", {**agent("C"), "mode": "NOPE"})
    await changed(watched, v)
    assert [a.key for a in watched.list()] == ["a", "b"]
    assert list(watched.errors) == ["c.json"]
    assert "mode: Input should be" in watched.errors["c.json"]

    v = watched.version
    write(directory, "c.json", agent("C"))
    await changed(watched, v)
    assert [a.key for a in watched.list()] == ["a", "b", "c"]
    assert prompt_of(watched, "c") == "C" and watched.errors == {}


async def test_ignored_files_cause_no_reload(watched: AgentRegistry) -> None:
    directory = watched.directory
    v = watched.version
    (directory / "notes.txt").write_text("x", encoding="utf-8")
    (directory / "agent.schema.json").write_text("{}", encoding="utf-8")
    write(directory, "a.json", agent())  # a marker: once it is in, the others were seen
    await changed(watched, v)
    assert watched.version == v + 1 and watched.errors == {}


async def test_watch_catches_up_with_changes_made_before_it_started(tmp_path: Path) -> None:
    registry = AgentRegistry(tmp_path)
    registry.load_all()
    write(tmp_path, "early.json", agent())  # after load_all, before watch()
    stop = asyncio.Event()
    task = asyncio.create_task(registry.watch(stop, step_ms=20))
    await registry.wait_for_version(1, timeout=WAIT_S)
    assert registry.get("early").key == "early"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_watching_a_missing_directory_returns_with_an_error_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry = AgentRegistry(tmp_path / "missing")
    await asyncio.wait_for(registry.watch(asyncio.Event()), WAIT_S)
    assert "does not exist: not watching it" in caplog.text
