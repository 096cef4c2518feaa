"""The built-in `_bash_` tool: a shell command, run in the sandbox (`service.builtins.sandbox`).

The command runs in the configured working directory, sees only that directory
and the allowed paths, and is bounded in time, output, memory and processes;
the result tells the model the exit code, whether the command timed out or its
output was cut, and what it printed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.builtins.sandbox import SandboxPolicy, SandboxResult, run_sandboxed
from service.core.tools.definitions import ToolDefinition, ToolError
from service.core.tools.registry import BackendTool, ToolCallInfo

NAME = "_bash_"
GRACE_S = 5.0  # the tool's own time-out exceeds the command's by this much


@dataclass(frozen=True)
class BashOptions:
    """The `_bash_` tool as configured (`service.app` builds it from the `bash_*` settings).

    Paths are taken as given (`~` and relative paths allowed); `policy_from`
    resolves them.
    """

    working_dir: Path
    allowed_paths: tuple[Path, ...] = ()
    timeout_s: float = 10.0
    output_limit_bytes: int = 64 * 1024
    memory_limit_bytes: int = 512 * 1024 * 1024
    max_processes: int = 64
    network: bool = False


def policy_from(options: BashOptions) -> SandboxPolicy:
    """The sandbox of the `_bash_` tool, from its options (paths resolved)."""
    return SandboxPolicy(
        working_dir=options.working_dir.expanduser().resolve(),
        allowed_paths=tuple(p.expanduser().resolve() for p in options.allowed_paths),
        timeout_s=options.timeout_s,
        output_limit_bytes=options.output_limit_bytes,
        memory_limit_bytes=options.memory_limit_bytes,
        max_processes=options.max_processes,
        network=options.network,
    )


def describe(result: SandboxResult) -> str:
    """The result as the model reads it."""
    lines = [
        f"exit_code: {'none (killed)' if result.exit_code is None else result.exit_code}",
        f"timed_out: {str(result.timed_out).lower()}",
        f"output_truncated: {str(result.truncated).lower()}",
        f"duration_ms: {round(result.duration_ms)}",
        "stdout:",
        result.stdout.rstrip("\n"),
        "stderr:",
        result.stderr.rstrip("\n"),
    ]
    return "\n".join(lines)


class Bash:
    """The tool's implementation."""

    def __init__(self, policy: SandboxPolicy) -> None:
        self.policy = policy

    async def __call__(self, arguments: dict[str, Any], call: ToolCallInfo) -> str:
        command = arguments.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ToolError("'command' must be a non-empty string")
        self.policy.working_dir.mkdir(parents=True, exist_ok=True)
        return describe(await run_sandboxed(command, self.policy))


def bash_tool(options: BashOptions) -> BackendTool:
    """The `_bash_` tool, running its commands in the sandbox `options` describe."""
    policy = policy_from(options)
    paths = ", ".join(str(p) for p in (policy.working_dir, *policy.allowed_paths))
    definition = ToolDefinition(
        name=NAME,
        kind="backend",
        description=(
            "Run a bash command in a sandbox and get its exit code and output. The working "
            f"directory is {policy.working_dir}; only these paths exist for the command: {paths}. "
            f"Time limit {policy.timeout_s:g} s"
            + ("" if policy.network else "; no network access")
            + "."
        ),
        parameters={
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command."}},
            "required": ["command"],
        },
        after_call_hint="Report what the command printed; when it failed, say why.",
        timeout_s=policy.timeout_s + GRACE_S,
    )
    return BackendTool(definition, Bash(policy))
