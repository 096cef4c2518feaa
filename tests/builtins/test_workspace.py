"""The working directory's quota: real bubblewrap, real writes, the host's disk measured."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from service.builtins.sandbox import SandboxPolicy, SandboxUnavailable, run_sandboxed
from service.builtins.workspace import MAX_DEPTH, Usage
from tests.builtins.kit import SLACK, disk_usage, snapshot
from tests.builtins.test_sandbox import marker, processes_with, wait_for_process

QUOTA = 8 * 1024 * 1024


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    directory = tmp_path / "ws"
    directory.mkdir()
    return directory


@pytest.fixture
def policy(workspace: Path) -> SandboxPolicy:
    return SandboxPolicy(
        working_dir=workspace, allowed_paths=(), timeout_s=10, workspace_quota_bytes=QUOTA
    )


@pytest.mark.parametrize(
    "command",
    [
        "head -c 64M /dev/zero > big",
        "dd if=/dev/zero of=big bs=1M count=64",
        "python3 -c \"open('big', 'wb').write(b'x' * (64 * 1024 * 1024))\"",
    ],
)
async def test_one_large_write_stops_at_the_quota(
    policy: SandboxPolicy, workspace: Path, command: str
) -> None:
    result = await run_sandboxed(f"{command}; echo rc=$?", policy)
    assert result.stdout == "rc=1\n"
    assert "No space left on device" in result.stderr
    assert result.workspace == Usage(QUOTA, QUOTA, full=True, saved=True)
    assert (workspace / "big").stat().st_size == QUOTA
    assert disk_usage(workspace) <= QUOTA + SLACK


@pytest.mark.parametrize(
    "command",
    [
        "for i in $(seq 40); do head -c 1M /dev/zero > f$i; done",
        "mkdir many && cd many && seq 1 5000 | xargs touch",
        "truncate -s 500M sparse",
        "head -c 3M /dev/zero > a && ln a b && ln a c && ln a d",
        "mkdir -p $(printf 'd/%.0s' $(seq 80)) && echo deep > $(printf 'd/%.0s' $(seq 80))/f",
    ],
    ids=["1M-files", "empty-files", "sparse", "hard-links", "deep"],
)
async def test_a_command_over_the_limits_leaves_the_directory_as_it_was(
    policy: SandboxPolicy, workspace: Path, command: str
) -> None:
    (workspace / "notes.txt").write_text("before\n")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "data").write_text("kept\n")
    before = snapshot(workspace)
    result = await run_sandboxed(f"echo changed > notes.txt; rm -r sub; {command}", policy)
    assert result.workspace == Usage(3 * 4096, QUOTA, full=True, saved=False)
    assert snapshot(workspace) == before
    assert disk_usage(workspace) <= QUOTA + SLACK


@pytest.mark.parametrize(("levels", "saved"), [(MAX_DEPTH, True), (MAX_DEPTH + 1, False)])
async def test_directories_nest_at_most_max_depth(
    policy: SandboxPolicy, workspace: Path, levels: int, saved: bool
) -> None:
    result = await run_sandboxed(f"mkdir -p $(printf 'd/%.0s' $(seq {levels}))", policy)
    assert result.exit_code == 0
    assert result.workspace is not None and result.workspace.saved is saved
    assert (workspace / ("d/" * levels)).is_dir() is saved


async def test_changes_are_mirrored_back_and_seen_by_the_next_command(
    policy: SandboxPolicy, workspace: Path
) -> None:
    (workspace / "old.txt").write_text("old\n")
    (workspace / "edit.txt").write_text("v1\n")
    (workspace / "gone").mkdir()
    (workspace / "gone" / "f").write_text("x\n")
    first = await run_sandboxed(
        "mkdir -p sub/deeper && echo new > sub/deeper/new.txt && echo v2 > edit.txt && "
        "rm -r gone old.txt && ln -s sub/deeper/new.txt link && ln -s /etc/shadow outward && "
        "echo run > tool && chmod 4755 tool && mkfifo pipe && echo done",
        policy,
    )
    assert (first.stdout, first.exit_code) == ("done\n", 0)
    assert first.workspace is not None and first.workspace.saved
    assert snapshot(workspace) == {
        "edit.txt": ("file", "v2\n"),
        "sub": ("dir", ""),
        "sub/deeper": ("dir", ""),
        "sub/deeper/new.txt": ("file", "new\n"),
        "link": ("link", "sub/deeper/new.txt"),
        "outward": ("link", "/etc/shadow"),
        "tool": ("file", "run\n"),
    }
    assert stat.S_IMODE((workspace / "tool").stat().st_mode) == 0o755  # no setuid on the host
    second = await run_sandboxed("cat link edit.txt; ls -a; cat outward", policy)
    assert second.stdout == "new\nv2\n.\n..\nedit.txt\nlink\noutward\nsub\ntool\n"
    assert second.exit_code != 0  # the link outward leads nowhere inside


async def test_unchanged_files_are_not_copied_back(policy: SandboxPolicy, workspace: Path) -> None:
    same = workspace / "same.bin"
    same.write_bytes(os.urandom(1024 * 1024))
    (workspace / "edit.txt").write_text("v1\n")
    before = same.stat()
    result = await run_sandboxed("md5sum same.bin > /dev/null && echo v2 > edit.txt", policy)
    assert result.exit_code == 0
    after = same.stat()
    assert (after.st_ino, after.st_ctime_ns) == (before.st_ino, before.st_ctime_ns)
    assert (workspace / "edit.txt").read_text() == "v2\n"


async def test_what_a_timed_out_command_wrote_is_kept(workspace: Path) -> None:
    short = SandboxPolicy(working_dir=workspace, allowed_paths=(), timeout_s=0.5)
    result = await run_sandboxed("echo partial > out; sleep 60", short)
    assert result.timed_out
    assert (workspace / "out").read_text() == "partial\n"


async def test_what_a_cancelled_command_wrote_is_kept(
    policy: SandboxPolicy, workspace: Path
) -> None:
    tag = marker()
    task = asyncio.create_task(
        run_sandboxed(f"echo partial > out; exec -a {tag} sleep 1000", policy)
    )
    await wait_for_process(tag)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert processes_with(tag) == []
    assert (workspace / "out").read_text() == "partial\n"


async def test_a_directory_already_over_its_quota_is_refused(
    policy: SandboxPolicy, workspace: Path
) -> None:
    (workspace / "big").write_bytes(b"x" * (QUOTA + 1))
    with pytest.raises(SandboxUnavailable, match="holds more than its quota of 8388608 bytes"):
        await run_sandboxed("echo hi", policy)
    assert (workspace / "big").stat().st_size == QUOTA + 1


async def test_protected_entries_are_neither_copied_nor_counted(
    policy: SandboxPolicy, workspace: Path
) -> None:
    (workspace / ".git").mkdir()
    (workspace / ".git" / "pack").write_bytes(b"x" * (QUOTA + 1))
    result = await run_sandboxed(
        "du -sb .git/pack | cut -f1; echo x > .git/new; df -B1 . | tail -1", policy
    )
    lines = result.stdout.split("\n")
    assert lines[0] == str(QUOTA + 1)  # read-only, from the host
    assert lines[1].split()[2] == "0"  # the tmpfs holds none of it
    assert "Read-only file system" in result.stderr
    assert sorted(p.name for p in (workspace / ".git").iterdir()) == ["pack"]


async def test_an_allowed_path_inside_the_working_directory_is_refused(
    policy: SandboxPolicy, workspace: Path
) -> None:
    (workspace / "shared").mkdir()
    inside = SandboxPolicy(working_dir=workspace, allowed_paths=(workspace / "shared",))
    with pytest.raises(SandboxUnavailable, match="inside the working directory"):
        await run_sandboxed("echo hi", inside)
