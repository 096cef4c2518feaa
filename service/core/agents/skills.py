"""Skills: the folders of the skills directory, each a `SKILL.md` teaching one kind of task.

A skill is a folder `skills/<name>/` holding a `SKILL.md` that starts with front
matter naming the skill and saying when it helps, then the instructions:

    ---
    name: trip-notes
    description: Write travel notes; use when the user plans a trip.
    ---
    # Writing trip notes
    ...

`name` must equal the folder's name; `description` is one line (at most 1024
characters). Other front-matter keys are allowed and ignored. Values may be
quoted, and a `>` or `|` block (indented lines below the key) may hold a longer
description.

The directory (`AGW_SKILLS_DIR`, default `skills/`) is a watched
`DirectoryRegistry` whose entries are folders: a skill added, edited (any file in
its folder) or removed takes effect on the next model turn; a broken `SKILL.md`
is reported (the folder and why) without touching the other skills, and a
broken edit keeps its last valid version. A folder without `SKILL.md` is not a
skill.

An agent with `skills` (true: every skill; or a list of names) gets them in two
steps: the system prompt of each stage offering the `skill` tool lists the
offered skills by name and description (`prompt_section`), and the `skill` tool
(service/core/tools/skill_tool.py) loads a skill's full text when the model
decides it needs it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from service.core.agents.definition import AgentDefinition
from service.core.agents.directory import (
    Combined,
    DirectoryChange,
    DirectoryRegistry,
    InvalidFile,
    first_wins,
)
from service.core.tools.names import SKILL_TOOL

log = logging.getLogger("agw.skills")

SKILL_FILE = "SKILL.md"
SKILLS_HEADING = "## Skills"
SKILLS_INTRO = (
    "Skills are instructions for particular kinds of task. When the task at hand matches "
    f"a skill's description, load the skill's full text with the {SKILL_TOOL} tool first "
    "and follow it."
)
MAX_DESCRIPTION = 1024
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_KEY = re.compile(r"^([A-Za-z0-9_-]+):(.*)$")


@dataclass(frozen=True, slots=True)
class Skill:
    """One skill: its name, when it helps, and its instructions (after the front matter)."""

    name: str
    description: str
    text: str


def parse_skill(content: str, folder: str) -> Skill:
    """The skill of a `SKILL.md`'s content, in folder `folder`; InvalidFile says what is wrong."""
    where = f"{folder}/{SKILL_FILE}"
    lines = content.replace("\r\n", "\n").removeprefix("\ufeff").split("\n")
    if not lines or lines[0].strip() != "---":
        raise InvalidFile(f"{where}: must start with front matter (a line '---')")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise InvalidFile(f"{where}: the front matter has no closing line '---'") from None
    fields = _front_matter(lines[1:end])
    name, description = fields.get("name", ""), " ".join(fields.get("description", "").split())
    problems = []
    if not name:
        problems.append("name is required")
    elif name != folder:
        problems.append(f"name '{name}' must equal the folder's name '{folder}'")
    elif not _NAME.match(name):
        problems.append(f"name '{name}' must be letters, digits, '_' or '-' (at most 64)")
    if not description:
        problems.append("description is required")
    elif len(description) > MAX_DESCRIPTION:
        problems.append(f"description is longer than {MAX_DESCRIPTION} characters")
    if problems:
        raise InvalidFile(f"{where}: " + "; ".join(problems))
    return Skill(name, description, "\n".join(lines[end + 1 :]).strip("\n"))


def _front_matter(lines: list[str]) -> dict[str, str]:
    """The top-level `key: value` pairs (a quoted value unquoted; `>`/`|` blocks joined)."""
    fields: dict[str, str] = {}
    key = ""
    block: list[str] | None = None
    for line in lines:
        if block is not None and (not line.strip() or line[:1] in (" ", "\t")):
            block.append(line.strip())
            continue
        if block is not None:
            fields[key] = " ".join(part for part in block if part)
            block = None
        found = _KEY.match(line)
        if found is None:
            continue  # a nested or list line of a key this reader ignores
        key, value = found.group(1), found.group(2).strip()
        if value in ("", ">", "|", ">-", "|-"):
            block = []
        elif len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            fields[key] = value[1:-1]
        else:
            fields[key] = value
    if block is not None:
        fields[key] = " ".join(part for part in block if part)
    return fields


class SkillFolders:
    """Skill folders: one skill per folder, from its `SKILL.md`."""

    noun = "skill"

    def relevant(self, path: Path) -> bool:
        return not path.name.startswith((".", "#", "~", "_"))

    def load(self, path: Path) -> Sequence[Skill]:
        """The folder's skill; FileNotFoundError when it has no SKILL.md (it is no skill)."""
        try:
            content = (path / SKILL_FILE).read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidFile(f"{path.name}/{SKILL_FILE}: not UTF-8 text ({exc})") from exc
        except NotADirectoryError:
            raise FileNotFoundError(path) from None
        return (parse_skill(content, path.name),)

    def combine(self, files: Mapping[str, Sequence[Skill]]) -> Combined[Skill]:
        return first_wins(files, lambda skill: skill.name)


class SkillRegistry(DirectoryRegistry[Skill]):
    """The valid skills of a directory, by name, with the errors of the broken ones."""

    recursive = True

    def __init__(
        self, directory: Path, *, on_change: Callable[[DirectoryChange], None] | None = None
    ) -> None:
        super().__init__(directory, SkillFolders(), on_change=on_change, logger=log)

    def entries(self) -> set[str]:
        """The folders of the directory (those without SKILL.md load as nothing)."""
        relevant = self.loader.relevant
        return {p.name for p in self.directory.iterdir() if relevant(p) and p.is_dir()}

    def entry_of(self, path: Path) -> str | None:
        """The skill folder a changed path is in (or is)."""
        try:
            parts = path.relative_to(self.directory).parts
        except ValueError:
            return None
        if not parts or not self.loader.relevant(Path(parts[0])):
            return None
        return parts[0]

    def offered(self, agent: AgentDefinition) -> list[Skill]:
        """The skills `agent` is offered now, by name."""
        return [skill for skill in self.list() if agent.offers_skill(skill.name)]

    def prompt_section(self, agent: AgentDefinition) -> str:
        """The part of a system prompt that lists the skills `agent` may load ("" for none)."""
        skills = self.offered(agent)
        if not skills:
            return ""
        lines = "\n".join(f"- {skill.name}: {skill.description}" for skill in skills)
        return f"\n\n{SKILLS_HEADING}\n{SKILLS_INTRO}\n{lines}"
