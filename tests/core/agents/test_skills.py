"""Skills: the watched skills directory, the system prompt's list, the `skill` tool, in-process."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from service.core.agents.directory import DirectoryChange, InvalidFile
from service.core.agents.skills import (
    SKILLS_HEADING,
    SKILLS_INTRO,
    Skill,
    SkillRegistry,
    parse_skill,
)
from service.core.errors import ToolNotFound
from service.testing import InProcess, ScriptedModel, write_agent
from tests.core.agents.test_directory import WAIT_S
from tests.core.modes.test_escalation import replayed
from tests.core.modes.test_inprocess import answer_turn, call_turn
from tests.core.tools.kit import Probe, agent, assert_invariants, kinds, result_of, tools

HEAD = ["request.query", "chat.start", "run.start"]
CALL = ["tool.start", "tool.args", "tool.args", "tool.end", "tool.result"]
ANSWER = ["content.start", "content.delta", "content.end"]
TRIP = """---
name: trip-notes
description: Write travel notes; use when the user plans a trip.
license: MIT
---
# Trip notes

List the places, then the times.
"""
POEM = """---
name: "poem"
description: >
  Write a short poem,
  when asked for verse.
---
Four lines, no rhyme.
"""


def write_skill(directory: Path, folder: str, text: str) -> Path:
    (directory / folder).mkdir(parents=True, exist_ok=True)
    path = directory / folder / "SKILL.md"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_skill_file_is_front_matter_then_instructions() -> None:
    assert parse_skill(TRIP, "trip-notes") == Skill(
        "trip-notes",
        "Write travel notes; use when the user plans a trip.",
        "# Trip notes\n\nList the places, then the times.",
    )
    assert parse_skill(POEM, "poem") == Skill(
        "poem", "Write a short poem, when asked for verse.", "Four lines, no rhyme."
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("# no front matter", "trip/SKILL.md: must start with front matter (a line '---')"),
        ("---\nname: trip\n", "trip/SKILL.md: the front matter has no closing line '---'"),
        (
            "---\nname: other\ndescription: x\n---\n",
            "trip/SKILL.md: name 'other' must equal the folder's name 'trip'",
        ),
        ("---\nname: trip\n---\n", "trip/SKILL.md: description is required"),
        ("---\ndescription: x\n---\n", "trip/SKILL.md: name is required"),
    ],
)
def test_a_broken_skill_file_says_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(InvalidFile) as caught:
        parse_skill(text, "trip")
    assert str(caught.value) == problem


def test_the_directory_holds_one_skill_per_folder_and_keeps_the_last_valid_version(
    tmp_path: Path,
) -> None:
    skills = SkillRegistry(tmp_path)
    write_skill(tmp_path, "trip-notes", TRIP)
    write_skill(tmp_path, "poem", POEM)
    (tmp_path / "scripts").mkdir()  # a folder without SKILL.md is no skill
    (tmp_path / "README.md").write_text("not a skill")
    assert skills.load_all() == DirectoryChange(1, added=("poem", "trip-notes"))
    assert [s.name for s in skills.list()] == ["poem", "trip-notes"]

    write_skill(tmp_path, "poem", "---\nname: poem\n---\n")
    assert skills.load_all() == DirectoryChange(2, failed=("poem",))
    assert skills.errors == {"poem": "poem/SKILL.md: description is required"}
    assert skills.items["poem"].text == "Four lines, no rhyme."  # the last valid version

    (tmp_path / "poem" / "SKILL.md").unlink()
    assert skills.load_all() == DirectoryChange(3, removed=("poem",), cleared=("poem",))
    assert list(skills.items) == ["trip-notes"]


async def test_the_watched_directory_sees_a_skills_file_change(tmp_path: Path) -> None:
    skills = SkillRegistry(tmp_path)
    stop = asyncio.Event()
    watch = asyncio.create_task(
        skills.watch(stop, force_polling=True, poll_delay_ms=20, step_ms=20, debounce_ms=50)
    )
    try:
        write_skill(tmp_path, "poem", POEM)
        await skills.wait_for_version(1, timeout=WAIT_S)
        assert list(skills.items) == ["poem"]
        path = write_skill(tmp_path, "poem", POEM.replace("Four lines", "Six lines"))
        mtime = path.stat().st_mtime_ns + 1_000_000_000
        os.utime(path, ns=(mtime, mtime))
        await skills.wait_for_version(2, timeout=WAIT_S)
        assert skills.items["poem"].text == "Six lines, no rhyme."
    finally:
        stop.set()
        await asyncio.wait_for(watch, WAIT_S)


@pytest.fixture
def model() -> ScriptedModel:
    return ScriptedModel()


@pytest.fixture
async def core(tmp_path: Path, model: ScriptedModel) -> AsyncIterator[InProcess]:
    skills_dir = tmp_path / "skills"
    write_skill(skills_dir, "trip-notes", TRIP)
    write_skill(skills_dir, "poem", POEM)
    agents_dir = tmp_path / "agents"
    write_agent(agents_dir, "all", agent("REACT", "Act.", toolConfig=tools("echo"), skills=True))
    write_agent(agents_dir, "one", agent("REACT", "Act.", skills=["poem"]))
    write_agent(
        agents_dir,
        "planner",
        agent(
            "PLAN_EXECUTE",
            skills=True,
            planExecute={"summary": {"systemPrompt": "Sum up.", "toolConfig": None}},
        ),
    )
    async with InProcess.start(
        agents_dir, model, builtin=Probe().tools(), skills_dir=skills_dir
    ) as running:
        yield running


async def test_the_skills_are_listed_and_one_is_loaded_on_demand(
    core: InProcess, model: ScriptedModel
) -> None:
    model.enqueue(call_turn("s1", "skill", {"name": "trip-notes"}), answer_turn("Notes."))
    events = await core.query("all", "Plan my trip")
    assert kinds(events) == [*HEAD, *CALL, *ANSWER, "run.complete"]
    assert_invariants(events)
    assert events[3].tool_start.tool_name == "skill"
    assert result_of(events[7]) == "# Trip notes\n\nList the places, then the times."
    first, second = model.requests
    assert [t["function"]["name"] for t in first.tools] == ["echo", "skill"]
    assert first.messages[0]["content"] == (
        "Act.\n\n## After calling a tool\n- echo: Quote the echo.\n\n"
        f"{SKILLS_HEADING}\n{SKILLS_INTRO}\n"
        "- poem: Write a short poem, when asked for verse.\n"
        "- trip-notes: Write travel notes; use when the user plans a trip."
    )
    assert second.messages[-1]["content"] == "# Trip notes\n\nList the places, then the times."
    await replayed(core, events)


async def test_an_agent_gets_only_its_skills(core: InProcess, model: ScriptedModel) -> None:
    model.enqueue(call_turn("s1", "skill", {"name": "trip-notes"}), answer_turn("No notes."))
    events = await core.query("one", "Plan my trip")
    refused = events[7]
    assert refused.tool_result.error
    assert result_of(refused) == ("Error: no skill 'trip-notes' (the skills you may load: poem)")
    system = model.requests[0].messages[0]["content"]
    assert system == (
        f"Act.\n\n{SKILLS_HEADING}\n{SKILLS_INTRO}\n"
        "- poem: Write a short poem, when asked for verse."
    )


async def test_stages_that_clear_their_tools_get_no_skills(
    core: InProcess, model: ScriptedModel
) -> None:
    tasks = {"tasks": [{"description": "Write"}]}
    update = {"taskId": "task_1", "status": "completed", "result": "w"}
    model.enqueue(
        call_turn("p1", "_plan_add_tasks_", tasks),
        call_turn("u1", "_plan_update_task_", update),
        answer_turn("Done."),
    )
    events = await core.query("planner", "Write")
    assert events[-1].type == "run.complete"
    planning, task, summary = model.requests
    assert [t["function"]["name"] for t in task.tools] == ["skill", "_plan_update_task_"]
    assert SKILLS_HEADING in task.messages[0]["content"]
    assert summary.tools == [] and SKILLS_HEADING not in summary.messages[0]["content"]
    assert SKILLS_INTRO not in planning.messages[0]["content"]  # the planner loads no skill


async def test_skills_need_the_skills_source(tmp_path: Path, model: ScriptedModel) -> None:
    agents_dir = tmp_path / "agents"
    write_agent(agents_dir, "all", agent("REACT", "Act.", skills=True))
    async with InProcess.start(agents_dir, model) as core:
        with pytest.raises(ToolNotFound, match="backends: 'skill' is not defined"):
            await core.query("all", "Hi")
