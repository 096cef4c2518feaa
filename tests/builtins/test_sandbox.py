"""The `_bash_` sandbox: real bubblewrap, real processes, the escapes an attacker tries."""

from __future__ import annotations

import asyncio
import gc
import os
import time
import uuid
from pathlib import Path

import pytest

from service.builtins import sandbox
from service.builtins.sandbox import SandboxPolicy, SandboxResult, SandboxUnavailable, run_sandboxed

REPO = Path(__file__).resolve().parents[2]
SECRET = "sk-test-secret"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    directory = tmp_path / "ws"
    directory.mkdir()
    return directory


@pytest.fixture
def policy(workspace: Path) -> SandboxPolicy:
    return SandboxPolicy(working_dir=workspace, allowed_paths=(), timeout_s=5)


def marker() -> str:
    return f"agw-marker-{uuid.uuid4().hex}"


def processes_with(text: str, *, argv0: bool = False) -> list[int]:
    """Pids of live host processes whose command line holds `text` (or starts with it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        head = cmdline.split(b"\0", 1)[0]
        if (head == text.encode()) if argv0 else (text.encode() in cmdline):
            found.append(int(entry.name))
    return found


async def wait_for_process(text: str) -> int:
    """The pid of the process named `text`, once it runs (the only signal is /proc)."""
    deadline = time.monotonic() + 5
    while not (pids := processes_with(text, argv0=True)):
        assert time.monotonic() < deadline, f"{text} never started"
        await asyncio.sleep(0.01)
    return pids[0]


def exists(path: str) -> bool:
    return Path(path).exists()


def sandbox_cgroups_of(pid: int) -> list[Path]:
    """The sandbox cgroup directories `pid` belongs to (one per cgroup1 hierarchy)."""
    found = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "agw-sandbox-" in path:
            found.append(sandbox.CGROUP_MOUNT / controllers / path.lstrip("/"))
    assert all(directory.is_dir() for directory in found)
    return found


def output(result: SandboxResult) -> str:
    return result.stdout + result.stderr


# --- normal use -------------------------------------------------------------------------


async def test_echo_exit_code_and_stderr(policy: SandboxPolicy) -> None:
    result = await run_sandboxed("echo hello; echo oops >&2; exit 3", policy)
    assert (result.stdout, result.stderr, result.exit_code) == ("hello\n", "oops\n", 3)
    assert not result.timed_out and not result.truncated
    assert 0 < result.duration_ms < 5000


async def test_files_written_in_the_working_dir_are_read_back(
    policy: SandboxPolicy, workspace: Path
) -> None:
    (workspace / "given.txt").write_text("from the host\n")
    result = await run_sandboxed(
        "pwd; ls; cat given.txt; echo made > made.txt && cat made.txt; whoami", policy
    )
    assert result.stdout == f"{workspace}\ngiven.txt\nfrom the host\nmade\nsandbox\n"
    assert result.exit_code == 0
    assert (workspace / "made.txt").read_text() == "made\n"


async def test_invalid_utf8_is_replaced(policy: SandboxPolicy) -> None:
    result = await run_sandboxed(r"printf 'a\377b'", policy)
    assert result.stdout == "a\ufffdb"


async def test_allowed_paths_are_writable_and_resolved(
    policy: SandboxPolicy, tmp_path: Path
) -> None:
    real = tmp_path / "shared-real"
    real.mkdir()
    link = tmp_path / "shared-link"
    link.symlink_to(real)
    allowed = SandboxPolicy(working_dir=policy.working_dir, allowed_paths=(link,), timeout_s=5)
    result = await run_sandboxed(f"echo x > {real}/out && cat {real}/out", allowed)
    assert (result.stdout, result.exit_code) == ("x\n", 0)
    assert (real / "out").read_text() == "x\n"


# --- the filesystem ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        "cat /etc/shadow",
        "ls /root",
        f"cat {REPO}/pyproject.toml",
        f"cat ../../../../../../..{REPO}/pyproject.toml",
        f"ls {REPO}/service",
        f"ls {REPO}/.venv/bin",
        "cat /proc/1/root/etc/shadow",
    ],
)
async def test_reads_outside_the_allowed_paths_fail(policy: SandboxPolicy, command: str) -> None:
    result = await run_sandboxed(command, policy)
    assert result.exit_code != 0
    assert result.stdout == ""


async def test_writes_outside_the_allowed_paths_do_not_reach_the_host(
    policy: SandboxPolicy, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    result = await run_sandboxed(
        f"echo 1 > {outside}; echo 2 > ../outside.txt; touch /usr/evil; touch /evil; "
        f"mkdir /etc/evil; echo 3 > {REPO}/evil.txt; echo done",
        policy,
    )
    assert result.stdout == "done\n"
    assert "Read-only file system" in result.stderr
    assert not outside.exists()
    assert not exists("/usr/evil") and not exists("/evil")
    assert not (REPO / "evil.txt").exists()


async def test_the_sandbox_root_is_read_only(policy: SandboxPolicy) -> None:
    result = await run_sandboxed("touch /evil || mkdir /evil || echo refused", policy)
    assert result.stdout == "refused\n"


async def test_concurrent_sandboxes_are_independent(policy: SandboxPolicy) -> None:
    results = await asyncio.gather(
        *(run_sandboxed(f"echo {n} > f{n}; sleep 0.2; cat f{n}", policy) for n in range(4))
    )
    assert [(r.stdout, r.exit_code) for r in results] == [(f"{n}\n", 0) for n in range(4)]


async def test_planted_symlinks_lead_nowhere(
    policy: SandboxPolicy, workspace: Path, tmp_path: Path
) -> None:
    (workspace / "to-root").symlink_to("/root")
    (workspace / "to-repo").symlink_to(REPO)
    (workspace / "to-parent").symlink_to(tmp_path)
    (tmp_path / "neighbour.txt").write_text("not yours\n")
    result = await run_sandboxed(
        "ls to-root/; cat to-repo/pyproject.toml; cat to-parent/neighbour.txt; "
        "ln -s / root-link; ls root-link/root; echo x > to-repo/evil.txt; echo end",
        policy,
    )
    assert result.stdout == "end\n"
    assert "not yours" not in output(result)
    assert not (REPO / "evil.txt").exists()


async def test_git_metadata_and_shell_rc_files_are_read_only(
    policy: SandboxPolicy, workspace: Path
) -> None:
    hooks = workspace / ".git" / "hooks"
    hooks.mkdir(parents=True)
    (workspace / ".bashrc").write_text("# mine\n")
    result = await run_sandboxed(
        "echo evil > .git/hooks/pre-commit; echo evil >> .bashrc; rm -rf .git; mv .git g; "
        "echo ok > notes.txt; ls -a",
        policy,
    )
    assert not (hooks / "pre-commit").exists()
    assert (workspace / ".bashrc").read_text() == "# mine\n"
    assert (workspace / "notes.txt").read_text() == "ok\n"
    assert ".git" in result.stdout.split()


async def test_a_symlinked_git_dir_is_not_mounted(policy: SandboxPolicy, workspace: Path) -> None:
    (workspace / ".git").symlink_to("/root")
    result = await run_sandboxed("ls .git/", policy)
    assert result.exit_code != 0 and result.stdout == ""


# --- the environment and the gateway process ---------------------------------------------


async def test_provider_keys_are_not_visible(
    policy: SandboxPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGW_PROVIDERS__X__API_KEY", SECRET)
    gateway = os.getpid()
    result = await run_sandboxed(
        "env; cat /proc/self/environ; echo $AGW_PROVIDERS__X__API_KEY; cat /proc/1/environ; "
        f"cat /proc/{gateway}/environ; cat /proc/$PPID/environ; "
        "grep -rs sk-test /proc/*/environ; ls /proc",
        policy,
    )
    assert SECRET not in output(result)
    assert str(gateway) not in result.stdout.split()
    assert "AGW_" not in result.stdout


# --- the network -----------------------------------------------------------------------


async def test_network_is_refused(policy: SandboxPolicy) -> None:
    accepted: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(await reader.read(100))
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        commands = {
            "bash": f"echo leak > /dev/tcp/127.0.0.1/{port}",
            "python": (
                f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}))\""
            ),
            "curl": f"curl -sS -m 2 http://127.0.0.1:{port}/",
            "dns": "curl -sS -m 2 http://example.com/",
        }
        for name, command in commands.items():
            result = await run_sandboxed(command, policy)
            assert result.exit_code != 0, name
    assert accepted == []


async def test_network_when_the_policy_allows_it(workspace: Path) -> None:
    accepted: list[bytes] = []
    received = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(await reader.read(100))
        received.set()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    open_policy = SandboxPolicy(working_dir=workspace, allowed_paths=(), network=True)
    async with server:
        result = await run_sandboxed(f"echo hello > /dev/tcp/127.0.0.1/{port}", open_policy)
        await asyncio.wait_for(received.wait(), 5)
    assert result.exit_code == 0
    assert accepted == [b"hello\n"]


# --- resources ---------------------------------------------------------------------------


async def test_fork_bomb_is_bounded_and_leaves_nothing(workspace: Path) -> None:
    tag = marker()
    bomb = SandboxPolicy(working_dir=workspace, allowed_paths=(), timeout_s=3)
    gaps: list[float] = []
    stop = asyncio.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    try:
        result = await run_sandboxed(f"# {tag}\n:(){{ :|:& }};:; sleep 60", bomb)
    finally:
        stop.set()
        await ticker
    assert result.timed_out and result.exit_code is None
    assert 2900 < result.duration_ms < 10_000
    assert processes_with(tag) == []
    # The event loop kept running all along: many ticks, none stalled.
    assert len(gaps) > 50
    assert max(gaps) < 1.0


async def test_process_count_is_capped(policy: SandboxPolicy) -> None:
    forks = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "except OSError:\n"
        "    print(n)\n"
    )
    result = await run_sandboxed(f"python3 -c '{forks}'", policy)
    assert result.exit_code == 0
    assert 0 < int(result.stdout) < policy.max_processes


@pytest.mark.parametrize(
    "command",
    [
        "head -c 2G /dev/zero | tail",
        'python3 -c "x = bytearray(10**10)"',
        "python3 -c \"x = b'x' * (300 * 1024 * 1024)\"",
        "head -c 400M /dev/zero > /tmp/fill && echo filled",
    ],
)
async def test_memory_bomb_fails_fast(policy: SandboxPolicy, command: str) -> None:
    result = await run_sandboxed(command, policy)
    assert result.exit_code not in (0, None), output(result)
    assert not result.timed_out
    assert "filled" not in result.stdout


async def test_memory_below_the_limit_is_fine(policy: SandboxPolicy) -> None:
    result = await run_sandboxed("python3 -c \"x = b'x' * (100 * 1024 * 1024); print(1)\"", policy)
    assert (result.stdout, result.exit_code) == ("1\n", 0)


async def test_output_flood_is_truncated_fast(policy: SandboxPolicy) -> None:
    result = await run_sandboxed("yes", policy)
    assert result.truncated and not result.timed_out
    assert result.exit_code is None
    assert len(result.stdout.encode()) == policy.output_limit_bytes
    assert result.duration_ms < 2000


async def test_output_budget_is_shared_by_both_streams(policy: SandboxPolicy) -> None:
    result = await run_sandboxed("yes out & yes err >&2", policy)
    assert result.truncated
    assert len(result.stdout.encode()) + len(result.stderr.encode()) == policy.output_limit_bytes


async def test_output_exactly_at_the_limit_is_not_truncated(policy: SandboxPolicy) -> None:
    result = await run_sandboxed(f"head -c {policy.output_limit_bytes} /dev/zero", policy)
    assert not result.truncated and result.exit_code == 0
    assert len(result.stdout) == policy.output_limit_bytes


# --- time-out, background processes, cancellation -------------------------------------------


async def test_time_out_kills_the_command(workspace: Path) -> None:
    tag = marker()
    short = SandboxPolicy(working_dir=workspace, allowed_paths=(), timeout_s=0.5)
    result = await run_sandboxed(f"echo started; exec -a {tag} sleep 60", short)
    assert result.timed_out and result.exit_code is None
    assert result.stdout == "started\n"
    assert 450 < result.duration_ms < 3000
    assert processes_with(tag) == []


async def test_background_processes_are_gone_on_return(policy: SandboxPolicy) -> None:
    tags = [marker() for _ in range(4)]
    command = (
        f"(exec -a {tags[0]} sleep 1000) & "
        f"nohup bash -c 'exec -a {tags[1]} sleep 1000' >/dev/null 2>&1 & "
        f"setsid bash -c 'exec -a {tags[2]} sleep 1000' & "
        f"(setsid bash -c '(exec -a {tags[3]} sleep 1000) &' &) ; "
        "echo launched"
    )
    result = await run_sandboxed(command, policy)
    assert (result.stdout, result.exit_code, result.timed_out) == ("launched\n", 0, False)
    assert result.duration_ms < 3000
    for tag in tags:
        assert processes_with(tag) == []


async def test_cancellation_kills_the_command_and_its_cgroup(policy: SandboxPolicy) -> None:
    tag = marker()
    task = asyncio.create_task(run_sandboxed(f"exec -a {tag} sleep 1000", policy))
    pid = await wait_for_process(tag)
    groups = sandbox_cgroups_of(pid)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert processes_with(tag) == []
    if os.geteuid() == 0:
        # As root the pids limit can only come from a cgroup: it must have existed, and be gone.
        assert groups
    assert not any(map(Path.exists, groups))


async def test_cancellation_leaves_no_unretrieved_failure(policy: SandboxPolicy) -> None:
    """The output readers of a cancelled command end as retrieved, not as an asyncio error
    log line ("_GatheringFuture exception was never retrieved") for every cancelled call."""
    loop = asyncio.get_running_loop()
    reported: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context["message"]))
    try:
        tag = marker()
        task = asyncio.create_task(run_sandboxed(f"exec -a {tag} sleep 1000", policy))
        await wait_for_process(tag)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        del task
        await asyncio.sleep(0)
        gc.collect()
    finally:
        loop.set_exception_handler(previous)
    assert reported == []


# --- when no sandbox can be built -------------------------------------------------------


async def test_refuses_without_a_pids_cgroup_as_root(
    policy: SandboxPolicy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.fail("this check needs root: RLIMIT_NPROC bounds processes otherwise")
    empty = tmp_path / "no-cgroups"
    empty.mkdir()
    monkeypatch.setattr(sandbox, "CGROUP_MOUNT", empty)
    with pytest.raises(SandboxUnavailable) as caught:
        await run_sandboxed("echo hi", policy)
    assert caught.value.reason == "SANDBOX_UNAVAILABLE"


async def test_refuses_without_bubblewrap(
    policy: SandboxPolicy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox, "HOST_PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailable, match="bwrap"):
        await run_sandboxed("echo hi", policy)


@pytest.mark.parametrize("bad", ["missing-dir", "root"])
async def test_refuses_bad_paths(workspace: Path, tmp_path: Path, bad: str) -> None:
    if bad == "missing-dir":
        policy = SandboxPolicy(working_dir=tmp_path / "nope", allowed_paths=())
    else:
        policy = SandboxPolicy(working_dir=workspace, allowed_paths=(Path("/"),))
    with pytest.raises(SandboxUnavailable):
        await run_sandboxed("echo hi", policy)
