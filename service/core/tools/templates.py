"""Argument templates: `{{tool_name.field}}` and `{{tool_name.field+Nd}}` in tool arguments.

Before a tool runs, every string in its arguments is scanned for templates. A
template names a field of the latest result of an earlier tool call in the same
run (`{{city_datetime.date}}`; nested fields and list items by dots:
`{{search.items.0.url}}`) and may shift a date by whole days (`+1d`, `-7d`).
Dates keep their form: `2025-03-01` stays a date, an ISO date-time stays one.
A string that is exactly one template without arithmetic takes the field's
value as it is (a number stays a number). A template that cannot be resolved is
an error fed back to the model as the call's result.
"""

from __future__ import annotations

import contextlib
import json
import re
from datetime import date, datetime, timedelta
from typing import Any

TEMPLATE = re.compile(
    r"\{\{\s*(?P<tool>[A-Za-z0-9_-]+)\.(?P<path>[A-Za-z0-9_.-]+?)"
    r"\s*(?:(?P<sign>[+-])\s*(?P<days>\d+)\s*d)?\s*\}\}"
)
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class TemplateError(ValueError):
    """A template names no earlier result, no such field, or shifts a value that is no date."""


class ResultMemory:
    """The latest result of each tool in a run, for templates to read."""

    __slots__ = ("_results",)

    def __init__(self) -> None:
        self._results: dict[str, Any] = {}

    def record(self, tool: str, result: Any) -> None:
        if isinstance(result, str):
            with contextlib.suppress(ValueError):
                result = json.loads(result)
        self._results[tool] = result

    def lookup(self, tool: str, path: str) -> Any:
        if tool not in self._results:
            raise TemplateError(f"no earlier result of tool '{tool}' in this run")
        value = self._results[tool]
        parts = path.split(".")
        for depth, part in enumerate(parts, 1):
            if isinstance(value, dict) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                field = ".".join(parts[:depth])
                raise TemplateError(f"the result of '{tool}' has no field '{field}'")
        return value


def has_templates(value: Any) -> bool:
    if isinstance(value, str):
        return "{{" in value
    if isinstance(value, dict):
        return any(has_templates(v) for v in value.values())
    if isinstance(value, list):
        return any(has_templates(v) for v in value)
    return False


def render(value: Any, memory: ResultMemory) -> Any:
    """`value` (parsed JSON arguments) with every template replaced."""
    if isinstance(value, str):
        return _render_string(value, memory)
    if isinstance(value, dict):
        return {k: render(v, memory) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, memory) for v in value]
    return value


def _render_string(text: str, memory: ResultMemory) -> Any:
    if "{{" not in text:
        return text
    whole = TEMPLATE.fullmatch(text.strip())
    if whole is not None and whole["sign"] is None:
        return memory.lookup(whole["tool"], whole["path"])

    def substitute(match: re.Match[str]) -> str:
        value = memory.lookup(match["tool"], match["path"])
        if match["sign"] is not None:
            days = int(match["days"]) * (-1 if match["sign"] == "-" else 1)
            return shift_date(value, days, match.group(0))
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    return TEMPLATE.sub(substitute, text)


def shift_date(value: Any, days: int, template: str = "") -> str:
    """`value` (an ISO date or date-time) moved by `days`, in the same form."""
    if isinstance(value, str):
        text = value.strip()
        try:
            if _DATE.match(text):
                return (date.fromisoformat(text) + timedelta(days=days)).isoformat()
            moved = datetime.fromisoformat(text.replace("Z", "+00:00")) + timedelta(days=days)
            out = moved.isoformat()
            return out.replace("+00:00", "Z") if text.endswith("Z") else out
        except ValueError:
            pass
    raise TemplateError(f"{template or 'template'}: {value!r} is not an ISO date or date-time")
