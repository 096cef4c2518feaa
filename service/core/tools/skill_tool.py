"""The `skill` tool: a built-in tool source that loads a skill's full text on demand.

The system prompt of an agent with `skills` lists its skills by name and
description (service/core/agents/skills.py); the model calls `skill` with one of those
names to read the skill's instructions (its `SKILL.md` after the front matter).
A name the calling agent is not offered, or no skill has, is an error result
that lists the skills it may load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.core.agents.registry import AgentRegistry
from service.core.agents.skills import SKILLS_HEADING, SkillRegistry
from service.core.tools.definitions import ToolDefinition, ToolError
from service.core.tools.names import SKILL_TOOL
from service.core.tools.sources import ToolCallInfo, ToolHandler

SKILL = ToolDefinition(
    name=SKILL_TOOL,
    kind="backend",
    description=(
        f"Load the full instructions of a skill listed under '{SKILLS_HEADING}' in the system "
        "prompt, by its name, when the task matches the skill's description."
    ),
    parameters={
        "type": "object",
        "properties": {"name": {"type": "string", "description": "The skill's name."}},
        "required": ["name"],
    },
    source="skills",
)


class SkillTools:
    """The source of the `skill` tool, reading the skills of a `SkillRegistry`."""

    name = "skills"
    executes = True
    version = 0  # its one definition never changes; the skills are read at each call

    def __init__(self, skills: SkillRegistry, agents: AgentRegistry) -> None:
        self.skills = skills
        self.agents = agents

    @property
    def errors(self) -> Mapping[str, str]:
        return {}

    def definitions(self) -> Mapping[str, ToolDefinition]:
        return {SKILL_TOOL: SKILL}

    def handler(self, name: str) -> ToolHandler | None:
        return self.load if name == SKILL_TOOL else None

    async def load(self, arguments: dict[str, Any], call: ToolCallInfo) -> str:
        """The text of the skill `arguments["name"]`, if the calling agent is offered it."""
        wanted = arguments.get("name")
        if not isinstance(wanted, str) or not wanted.strip():
            raise ToolError("'name' must be the name of a skill")
        agent = self.agents.items.get(call.agent_key)
        offered = self.skills.offered(agent) if agent is not None else []
        for skill in offered:
            if skill.name == wanted.strip():
                return skill.text
        names = ", ".join(skill.name for skill in offered) or "none"
        raise ToolError(f"no skill '{wanted}' (the skills you may load: {names})")
