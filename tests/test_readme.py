"""The documentation's examples, run as written against a real service, so that they cannot rot.

The documents are the READMEs — the repository's own and the clients'
(`clients/README.md`) — and every page of the documentation site (`docs/**/*.md`).

A fenced block preceded by `<!-- run: sh -->`, `<!-- run: python -->` or
`<!-- run: node -->` is run from the repository root against the service this
test starts (the `Harness` on loopback ports: the example agents and tools of
the repository on the built-in demo model, chats in a temporary directory):

* a shell block command by command (a line ending in `\\` goes on on the next
  one), each with bash; the `# ` lines right under a command are what it must
  print (a lone `#` an empty line);
* a Python block whole, with this test's interpreter; a Node block whole, with
  `node` reading it from stdin, so that `require('./clients/node')` resolves from
  the repository root as it does for a file there;
* the next fenced block, when preceded by `<!-- output -->`, is what a Python or
  Node block (or a shell block of one command) must print.

Each must exit 0 and print what the document says, line by line: "…" stands for
any text within a line, and a line of "…" alone for any number of lines.

The documents show the documented defaults; before running a block the test
replaces `127.0.0.1:50051` by the test service's gRPC address and
`127.0.0.1:8080` by its HTTP address, and `.venv/bin/` (where `make` installs
the programs) by the directory of this test's interpreter, and sets `AGW_TARGET`
for the clients that take their address from it.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.testing import Harness

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
READMES = (README, ROOT / "clients" / "README.md", *sorted((ROOT / "docs").glob("**/*.md")))
GRPC_DEFAULT, HTTP_DEFAULT = "127.0.0.1:50051", "127.0.0.1:8080"
ELLIPSIS = "…"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.M | re.S)
MARK = re.compile(r"<!-- (run: (?:sh|python|node)|output) -->$")


@dataclass(frozen=True)
class Example:
    """A runnable block of a document."""

    readme: str  # its path in the repository
    language: str
    code: str
    line: int  # of the block's first line in the document
    output: str | None  # the `output` block after it, if any


def examples(readme: Path) -> list[Example]:
    """The document's runnable blocks, each with the output block that follows it."""
    text = readme.read_text()
    blocks: list[tuple[str, str, int]] = []  # (mark, code, line)
    for fence in FENCE.finditer(text):
        before = text[: fence.start()]
        mark = MARK.search(before.rstrip("\n"))  # the mark, right above the fence
        line = before.count("\n") + 2
        blocks.append((mark.group(1) if mark else "", fence.group(2), line))
    found = []
    for index, (mark, code, line) in enumerate(blocks):
        if not mark.startswith("run: "):
            continue
        after = blocks[index + 1] if index + 1 < len(blocks) else None
        output = after[1] if after is not None and after[0] == "output" else None
        name = str(readme.relative_to(ROOT))
        found.append(Example(name, mark.removeprefix("run: "), code, line, output))
    return found


def commands(script: str) -> list[tuple[str, list[str] | None]]:
    """A shell block's commands, each with the lines it must print (None: not said)."""
    found: list[tuple[str, list[str] | None]] = []
    pending = ""
    for raw in script.splitlines():
        if pending:
            pending += "\n" + raw
            if not raw.endswith("\\"):
                found.append((pending, None))
                pending = ""
            continue
        if raw == "#" or raw.startswith("# "):
            assert found, f"an output line before any command: {raw!r}"
            command, expected = found[-1]
            found[-1] = (command, [*(expected or []), raw[2:]])
        elif raw.strip():
            if raw.endswith("\\"):
                pending = raw
            else:
                found.append((raw, None))
    assert not pending, "a command ends with a line continuation"
    return found


def line_pattern(expected: str) -> re.Pattern[str]:
    parts = [re.escape(part) for part in expected.split(ELLIPSIS)]
    return re.compile(".*".join(parts), re.S)


def matches(expected: list[str], actual: list[str]) -> bool:
    """Whether `actual` is `expected`, "…" within a line being any text and a line of "…"
    alone any number of lines."""
    if not expected:
        return not actual
    head, rest = expected[0], expected[1:]
    if head == ELLIPSIS:
        return any(matches(rest, actual[skip:]) for skip in range(len(actual) + 1))
    if not actual or not line_pattern(head).fullmatch(actual[0]):
        return False
    return matches(rest, actual[1:])


def assert_prints(expected: list[str], stdout: str, what: str) -> None:
    actual = stdout.splitlines()
    if not matches(expected, actual):
        shown = "\n".join(actual[:40])
        raise AssertionError(
            f"{what} printed:\n{shown}\n\nnot what the README says:\n" + "\n".join(expected)
        )


def test_the_matching_rules() -> None:
    assert matches(["a …", "…", "z"], ["a b c", "x", "y", "z"])
    assert matches(["a", "…"], ["a"])
    assert not matches(["a"], ["a", "b"])
    assert not matches(["a …"], ["b a c"])
    assert matches(["{…}"], ["{1}"]) and not matches(["(…)"], ["{1}"])
    assert commands("a \\\n  b\n# out\n#\nc  # not output\n") == [
        ("a \\\n  b", ["out", ""]),
        ("c  # not output", None),
    ]


EXAMPLES = [example for readme in READMES for example in examples(readme)]


def test_the_documents_have_examples_of_each_kind() -> None:
    assert {e.language for e in examples(README)} == {"sh", "python"}
    assert {e.language for e in EXAMPLES} == {"sh", "python", "node"}
    assert all(e.output is not None for e in EXAMPLES if e.language != "sh")


def test_the_docs_pages_are_collected() -> None:
    pages = {e.readme for e in EXAMPLES if e.readme.startswith("docs/")}
    assert {"docs/grpc.md", "docs/http.md", "docs/clients.md", "docs/a2a.md"} <= pages


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness.start(
        ROOT / "agents",
        tools_dir=ROOT / "tools",
        tools_watch=False,
        data_dir=tmp_path / "data",
        bash_working_dir=tmp_path / "workspace",
        demo_delay_ms=0,
        agent_store="memory",  # the example of "Agents in the database" writes to it
        webhook_allowed_hosts=["127.0.0.1"],  # as the webhook example says
    ) as harness:
        yield harness


def localized(code: str, service: Harness) -> str:
    """The block with the test service's addresses and this interpreter's directory."""
    grpc_target = f"127.0.0.1:{service.app.grpc.port}"
    http_target = service.http_url.removeprefix("http://")
    return (
        code.replace(GRPC_DEFAULT, grpc_target)
        .replace(HTTP_DEFAULT, http_target)
        .replace(".venv/bin/", f"{Path(sys.executable).parent}/")
    )


async def run(argv: list[str], stdin: str, service: Harness) -> tuple[int, str, str]:
    env = {**os.environ, "AGW_TARGET": f"127.0.0.1:{service.app.grpc.port}", "NO_COLOR": "1"}
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=ROOT,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(stdin.encode()), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.mark.parametrize(
    "example", EXAMPLES, ids=[f"{e.readme}:{e.line}:{e.language}" for e in EXAMPLES]
)
async def test_readme_example(example: Example, service: Harness) -> None:
    where = f"the {example.language} block at {example.readme} line {example.line}"
    if example.language == "sh":
        steps = commands(example.code)
        if example.output is not None:
            assert len(steps) == 1, f"{where}: an output block follows one command only"
            steps = [(steps[0][0], example.output.splitlines())]
        for command, expected in steps:
            argv = ["bash", "-o", "pipefail", "-c", localized(command, service)]
            code, out, err = await run(argv, "", service)
            assert code == 0, f"{where}: `{command}` exited {code}: {err}"
            if expected is not None:
                assert_prints(expected, out, f"{where}: `{command}`")
        return
    if example.language == "python":
        argv = [sys.executable, "-"]
    else:
        node = shutil.which("node")
        assert node, "Node.js is needed for the README's Node example"
        argv = [node, "-"]
    code, out, err = await run(argv, localized(example.code, service), service)
    assert code == 0, f"{where} exited {code}: {err}"
    assert example.output is not None
    assert_prints(example.output.splitlines(), out, where)
