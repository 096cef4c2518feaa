"""System prompts with their variables filled in from the request that runs them.

The variables and their check at load time are in service/core/agents/variables.py;
here they get their values: the run's start time (`QueryCommand.started_at_ms`, taken
once by the front door and journaled with the command, so a resumed run renders the
same prompt), the caller, the query's `params` and `scene`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from service.core.agents.variables import TOKEN
from service.core.commands import QueryCommand
from service.core.errors import InvalidRequest
from service.core.tools.templates import TemplateError, shift_date


@dataclass(frozen=True, slots=True)
class PromptValues:
    """What a run's prompts may name."""

    started_at_ms: int = 0
    user: str = ""
    params: dict[str, Any] | None = None
    scene: dict[str, Any] | None = None

    @classmethod
    def of(cls, command: QueryCommand) -> PromptValues:
        return cls(command.started_at_ms, command.principal.subject, command.params, command.scene)

    def lookup(self, name: str, path: str) -> Any:
        """The value of `{{name.path}}`; None for a field the query did not give."""
        started = datetime.fromtimestamp(self.started_at_ms / 1000, UTC)
        if name == "date":
            return started.date().isoformat()
        if name == "now":
            return started.replace(microsecond=0).isoformat().replace("+00:00", "Z")
        if name == "user":
            return self.user
        value: Any = self.params if name == "params" else self.scene
        for part in path.split(".") if path else ():
            if isinstance(value, dict):
                value = value.get(part)
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                return None
        return value


def render(text: str, values: PromptValues) -> str:
    """`text` with its variables filled in; InvalidRequest when a date cannot be shifted."""
    if "{{" not in text:
        return text

    def fill(match: re.Match[str]) -> str:
        if match["name"] is None:  # \{{
            return "{{"
        value = values.lookup(match["name"], match["path"] or "")
        if match["sign"] is not None:
            days = int(match["days"]) * (-1 if match["sign"] == "-" else 1)
            try:
                return shift_date(value, days, match.group())
            except TemplateError as error:
                raise InvalidRequest(f"system prompt: {error}") from None
        if value is None:
            return ""
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    return TOKEN.sub(fill, text)
