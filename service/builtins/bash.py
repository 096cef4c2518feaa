"""The built-in `_bash_` tool: a shell command, run in the sandbox (`service.builtins.sandbox`).

Each chat has its own workspace, `{working_dir}/chats/{chatId}` (created on
first use; the core has checked the chat id), and the command runs there,
seeing that directory at its own path, the allowed paths, and nothing else of
the host: no other chat's files. The workspace persists between calls and
holds at most `workspace_quota_bytes`. The command is bounded in time, output,
memory and processes; the result tells the model the exit code, whether the
command timed out or its output was cut, what it printed, and how full the
workspace is. While it runs, each line it prints is reported (`tool.progress`); once it
has ended, each file it created or changed in the workspace is announced (`file.create`,
`file.update`; service/builtins/files.py reads the workspaces for ListFiles and
DownloadFile).

Calls take turns: one at a time per chat (they share its workspace), and at
most `max_concurrent` sandboxes at once in the service. A call waits for its
turn at most its time-out, then gets the whole time-out to run; the tool's own
time-out covers both. Memory in use by sandboxes is therefore bounded by
`max_concurrent` times the per-call memory limit (and the workspace copies).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import dataclasses
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.builtins.files import changes, mime_type_of, snapshot
from service.builtins.sandbox import SandboxPolicy, SandboxResult, run_sandboxed
from service.builtins.workspace import Usage
from service.core.ids import valid_chat_id
from service.core.tools.definitions import ToolDefinition, ToolError
from service.core.tools.registry import BackendTool, ToolCallInfo
from service.core.tools.sources import ProgressReport

NAME = "_bash_"
GRACE_S = 5.0  # the tool's own time-out exceeds the wait and the command's by this much
CHATS = "chats"  # the chats' workspaces are {working_dir}/chats/{chatId}


@dataclass(frozen=True)
class BashOptions:
    """The `_bash_` tool as configured (`service.assembly` builds it from the `bash_*` settings).

    Paths are taken as given (`~` and relative paths allowed); `policy_from`
    resolves them. `working_dir` holds the chats' workspaces; an allowed path
    may not overlap them.
    """

    working_dir: Path
    allowed_paths: tuple[Path, ...] = ()
    timeout_s: float = 10.0
    output_limit_bytes: int = 64 * 1024
    memory_limit_bytes: int = 512 * 1024 * 1024
    max_processes: int = 64
    network: bool = False
    workspace_quota_bytes: int = 256 * 1024 * 1024
    max_concurrent: int = 4


def policy_from(options: BashOptions) -> SandboxPolicy:
    """The sandbox of the `_bash_` tool, from its options (paths resolved).

    Its `working_dir` is the root of the workspaces; each call runs in its
    chat's (`workspace_of`). Raises ValueError when an allowed path overlaps
    the workspaces, which would show one chat another's files.
    """
    policy = SandboxPolicy(
        working_dir=options.working_dir.expanduser().resolve(),
        allowed_paths=tuple(p.expanduser().resolve() for p in options.allowed_paths),
        timeout_s=options.timeout_s,
        output_limit_bytes=options.output_limit_bytes,
        memory_limit_bytes=options.memory_limit_bytes,
        max_processes=options.max_processes,
        network=options.network,
        workspace_quota_bytes=options.workspace_quota_bytes,
    )
    chats = policy.working_dir / CHATS
    for path in policy.allowed_paths:
        if path == chats or path in chats.parents or chats in path.parents:
            raise ValueError(f"the allowed path {path} overlaps the chats' workspaces in {chats}")
    return policy


def chats_dir(options: BashOptions) -> Path:
    """Where the chats' workspaces are: `{working_dir}/chats`, resolved."""
    return options.working_dir.expanduser().resolve() / CHATS


def workspace_of(policy: SandboxPolicy, chat_id: str) -> Path:
    """The chat's workspace under the policy's working directory."""
    return policy.working_dir / CHATS / chat_id


def describe(result: SandboxResult) -> str:
    """The result as the model reads it."""
    lines = [
        f"exit_code: {'none (killed)' if result.exit_code is None else result.exit_code}",
        f"timed_out: {str(result.timed_out).lower()}",
        f"output_truncated: {str(result.truncated).lower()}",
        f"duration_ms: {round(result.duration_ms)}",
    ]
    if result.workspace is not None:
        lines.append(f"workspace: {describe_workspace(result.workspace)}")
    lines += ["stdout:", result.stdout.rstrip("\n"), "stderr:", result.stderr.rstrip("\n")]
    return "\n".join(lines)


def describe_workspace(usage: Usage) -> str:
    """How full the workspace is, and whether the command ran into its quota."""
    quota = size_text(usage.quota_bytes)
    if not usage.saved and not usage.full:
        return (
            "not saved: the sandbox did not end in time, so the command's changes to the "
            f"workspace were discarded ({size_text(usage.used_bytes)} kept)"
        )
    if not usage.saved:
        return (
            f"quota exceeded: the command's files went over the {quota} quota, so its changes "
            f"to the workspace were discarded ({size_text(usage.used_bytes)} kept)"
        )
    used = f"{size_text(usage.used_bytes)} of {quota} used"
    if usage.full:
        return f"quota reached ({used}): writes past it failed"
    return used


def size_text(n: int) -> str:
    """`n` bytes for a reader: 512 B, 12.5 KiB, 256 MiB."""
    if n < 1024:
        return f"{n} B"
    value = n / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f}".removesuffix(".0") + f" {unit}"
        value /= 1024
    return f"{value:.1f}".removesuffix(".0") + " GiB"


class Bash:
    """The tool's implementation: per-chat workspaces, turns, and the sandbox."""

    def __init__(self, policy: SandboxPolicy, max_concurrent: int) -> None:
        self.policy = policy
        self.max_concurrent = max_concurrent
        self.slots = asyncio.Semaphore(max_concurrent)
        self.chats: dict[str, _Turns] = {}

    async def __call__(self, arguments: dict[str, Any], call: ToolCallInfo) -> str:
        command = arguments.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ToolError("'command' must be a non-empty string")
        if not valid_chat_id(call.chat_id):
            raise ToolError(f"no workspace for chat id {call.chat_id[:140]!r}")
        workspace = workspace_of(self.policy, call.chat_id)
        workspace.mkdir(mode=0o700, parents=True, exist_ok=True)
        policy = dataclasses.replace(self.policy, working_dir=workspace)
        async with contextlib.AsyncExitStack() as turn:
            try:
                async with asyncio.timeout(self.policy.timeout_s):
                    await turn.enter_async_context(self._chat_turn(call.chat_id))
                    await turn.enter_async_context(self.slots)
            except TimeoutError:
                raise ToolError(
                    f"no sandbox was free within {self.policy.timeout_s:g} s (at most "
                    f"{self.max_concurrent} commands run at once, one at a time per chat); "
                    "try again"
                ) from None
            lines = OutputLines(call.progress)
            before = await asyncio.to_thread(snapshot, workspace) if call.files else {}
            result = await run_sandboxed(command, policy, lines.feed if call.progress else None)
            lines.flush()
            if call.files is not None:  # what the call wrote: file.create, file.update
                after = await asyncio.to_thread(snapshot, workspace)
                for path, size, created in changes(before, after):
                    call.files(path, size, mime_type_of(path), created=created)
            return describe(result)

    @contextlib.asynccontextmanager
    async def _chat_turn(self, chat_id: str) -> AsyncIterator[None]:
        """Hold the chat's workspace: its calls run one after another."""
        turns = self.chats.setdefault(chat_id, _Turns())
        turns.waiting += 1
        try:
            async with turns.lock:
                yield
        finally:
            turns.waiting -= 1
            if not turns.waiting:
                del self.chats[chat_id]


class OutputLines:
    """A command's output, reported line by line as it comes (`tool.progress`): each
    complete line of stdout or stderr, without its line break, as soon as it is read."""

    def __init__(self, report: ProgressReport | None) -> None:
        self.report = report
        self._decoders = {
            name: codecs.getincrementaldecoder("utf-8")("replace") for name in STREAMS
        }
        self._partial = dict.fromkeys(STREAMS, "")

    def feed(self, stream: str, chunk: bytes) -> None:
        text = self._partial[stream] + self._decoders[stream].decode(chunk)
        *lines, self._partial[stream] = text.split("\n")
        for line in lines:
            self._send(stream, line)

    def flush(self) -> None:
        """Report what is left of each stream after its last line break."""
        for stream in STREAMS:
            rest = self._partial[stream] + self._decoders[stream].decode(b"", final=True)
            self._partial[stream] = ""
            if rest:
                self._send(stream, rest)

    def _send(self, stream: str, line: str) -> None:
        if self.report is not None:
            self.report(line.removesuffix("\r"), stream=stream)


STREAMS = ("stdout", "stderr")


@dataclass
class _Turns:
    """The calls of one chat, waiting for or holding its workspace."""

    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    waiting: int = 0


def bash_tool(options: BashOptions) -> BackendTool:
    """The `_bash_` tool, running its commands in the sandbox `options` describe."""
    policy = policy_from(options)
    others = ", ".join(str(p) for p in policy.allowed_paths)
    definition = ToolDefinition(
        name=NAME,
        kind="backend",
        description=(
            "Run a bash command in a sandbox and get its exit code and output. The working "
            "directory is this chat's own workspace: its files stay between commands, up to "
            f"{size_text(policy.workspace_quota_bytes)} in all"
            + (f"; the only other paths that exist for the command: {others}" if others else "")
            + f". Time limit {policy.timeout_s:g} s"
            + ("" if policy.network else "; no network access")
            + "."
        ),
        parameters={
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command."}},
            "required": ["command"],
        },
        after_call_hint="Report what the command printed; when it failed, say why.",
        timeout_s=2 * policy.timeout_s + GRACE_S,
    )
    return BackendTool(definition, Bash(policy, options.max_concurrent))


async def remove_workspace(working_dir: Path, chat_id: str) -> None:
    """Delete chat `chat_id`'s workspace under `working_dir` (its chat is deleted); nothing
    when it has none. Symbolic links inside are removed, never followed."""
    if not valid_chat_id(chat_id):
        return

    def remove() -> None:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(working_dir.expanduser().resolve() / CHATS / chat_id)

    await asyncio.to_thread(remove)
