"""The `_bash_` tool's handler: per-chat workspaces, turns within a chat, the cap on sandboxes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from service.builtins.bash import BashOptions, bash_tool, describe, policy_from, size_text
from service.builtins.sandbox import SandboxResult
from service.builtins.workspace import Usage
from service.core.tools.definitions import ToolError
from service.core.tools.registry import ToolCallInfo
from tests.builtins.kit import TIMED, intervals_in, most_at_once


def call(chat_id: str) -> ToolCallInfo:
    return ToolCallInfo("run", chat_id, "call_1", "_bash_")


async def test_each_chat_works_in_its_own_workspace(tmp_path: Path) -> None:
    root = tmp_path / "work"
    tool = bash_tool(BashOptions(working_dir=root))
    await tool.handler({"command": "echo secret > mine.txt"}, call("alice"))
    result = await tool.handler(
        {"command": f"pwd; ls -a; ls {root}/chats; cat {root}/chats/alice/mine.txt"},
        call("bob"),
    )
    bob = (root / "chats" / "bob").resolve()
    assert result.startswith("exit_code: 1\n")
    assert f"stdout:\n{bob}\n.\n..\nbob\nstderr:\n" in result
    assert "secret" not in result
    assert (root / "chats" / "alice" / "mine.txt").read_text() == "secret\n"
    assert list((root / "chats" / "bob").iterdir()) == []


async def test_at_most_max_concurrent_sandboxes_run_at_once(tmp_path: Path) -> None:
    root = tmp_path / "work"
    tool = bash_tool(BashOptions(working_dir=root, timeout_s=10, max_concurrent=2))
    chats = [f"chat-{n}" for n in range(6)]
    started = time.monotonic()
    results = await asyncio.gather(*(tool.handler({"command": TIMED}, call(c)) for c in chats))
    elapsed = time.monotonic() - started
    assert all(r.startswith("exit_code: 0\n") for r in results)
    intervals = [
        interval
        for chat in chats
        for interval in intervals_in((root / "chats" / chat / "times").read_text())
    ]
    assert len(intervals) == 6
    assert most_at_once(intervals) == 2
    assert elapsed > 3 * 0.5  # three rounds of two


async def test_calls_in_one_chat_take_turns_and_lose_nothing(tmp_path: Path) -> None:
    root = tmp_path / "work"
    tool = bash_tool(BashOptions(working_dir=root, timeout_s=10, max_concurrent=4))
    results = await asyncio.gather(*(tool.handler({"command": TIMED}, call("one")) for _ in "abc"))
    assert all(r.startswith("exit_code: 0\n") for r in results)
    intervals = intervals_in((root / "chats" / "one" / "times").read_text())
    assert len(intervals) == 3
    assert most_at_once(intervals) == 1


async def test_a_call_waits_for_a_sandbox_at_most_its_time_out(tmp_path: Path) -> None:
    tool = bash_tool(BashOptions(working_dir=tmp_path / "work", timeout_s=1, max_concurrent=1))
    started = time.monotonic()
    busy, waiting = await asyncio.gather(
        tool.handler({"command": "sleep 30"}, call("busy")),
        tool.handler({"command": "echo never"}, call("waiting")),
        return_exceptions=True,
    )
    assert isinstance(busy, str) and "timed_out: true" in busy
    assert isinstance(waiting, ToolError)
    assert str(waiting) == (
        "no sandbox was free within 1 s (at most 1 commands run at once, one at a time per "
        "chat); try again"
    )
    assert time.monotonic() - started < 1 + 5
    assert tool.definition.timeout_s == 2 * 1 + 5  # the wait and the command fit in it


async def test_a_chat_id_that_is_no_directory_name_gets_no_workspace(tmp_path: Path) -> None:
    tool = bash_tool(BashOptions(working_dir=tmp_path / "work"))
    for bad in ("../escape", "", ".hidden", "a/b", "x\n"):
        with pytest.raises(ToolError, match="no workspace for chat id"):
            await tool.handler({"command": "touch x"}, call(bad))
    assert not (tmp_path / "escape").exists()
    assert not (tmp_path / "work" / "chats").exists()


@pytest.mark.parametrize("allowed", ["work", "work/chats", "work/chats/x", "."])
def test_allowed_paths_may_not_overlap_the_workspaces(tmp_path: Path, allowed: str) -> None:
    options = BashOptions(working_dir=tmp_path / "work", allowed_paths=(tmp_path / allowed,))
    with pytest.raises(ValueError, match="overlaps the chats' workspaces"):
        bash_tool(options)


def test_an_allowed_path_beside_the_workspaces_is_fine(tmp_path: Path) -> None:
    options = BashOptions(working_dir=tmp_path / "work", allowed_paths=(tmp_path / "work/shared",))
    policy = policy_from(options)
    assert policy.allowed_paths == ((tmp_path / "work/shared").resolve(),)
    assert policy.workspace_quota_bytes == 256 * 1024 * 1024
    description = bash_tool(options).definition.description
    assert "this chat's own workspace: its files stay between commands, up to 256 MiB" in (
        description
    )
    assert f"the only other paths that exist for the command: {policy.allowed_paths[0]}" in (
        description
    )


@pytest.mark.parametrize(
    ("usage", "line"),
    [
        (Usage(12 * 1024, 2**28, full=False, saved=True), "12 KiB of 256 MiB used"),
        (
            Usage(2**28, 2**28, full=True, saved=True),
            "quota reached (256 MiB of 256 MiB used): writes past it failed",
        ),
        (
            Usage(1536, 2**28, full=True, saved=False),
            "quota exceeded: the command's files went over the 256 MiB quota, so its changes "
            "to the workspace were discarded (1.5 KiB kept)",
        ),
        (
            Usage(0, 2**28, full=False, saved=False),
            "not saved: the sandbox did not end in time, so the command's changes to the "
            "workspace were discarded (0 B kept)",
        ),
    ],
)
def test_the_result_tells_how_full_the_workspace_is(usage: Usage, line: str) -> None:
    result = SandboxResult("out\n", "", 0, False, False, 12.3, workspace=usage)
    assert describe(result) == (
        "exit_code: 0\ntimed_out: false\noutput_truncated: false\nduration_ms: 12\n"
        f"workspace: {line}\nstdout:\nout\nstderr:\n"
    )


def test_sizes_for_a_reader() -> None:
    assert [size_text(n) for n in (0, 1023, 1024, 1536, 2**20, 5 * 2**30 + 2**29)] == [
        "0 B",
        "1023 B",
        "1 KiB",
        "1.5 KiB",
        "1 MiB",
        "5.5 GiB",
    ]
