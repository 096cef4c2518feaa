"""Reading an agent file: the `\"\"\"`-aware JSON parser and the report of what is wrong.

`load_agent_file` / `parse_agent_text` turn a file into an immutable `AgentDefinition`
or raise `AgentDefinitionError` naming each offending field and why.

Multi-line prompts. A value of a key whose name ends in `systemPrompt` (any case) may
be written as `\"\"\"...\"\"\"` (not standard JSON); it is converted to a JSON string before
parsing, by these rules:

* the text is taken verbatim: quotes, backslashes, tabs and indentation stay as written
  (no escape sequences are interpreted, no dedent); line endings become `\\n`;
* if the opening `\"\"\"` is followed only by blanks up to the end of its line, that line
  break is dropped; if the closing `\"\"\"` is preceded only by blanks since the last line
  break, that line break and the blanks are dropped;
* the text ends at the first `\"\"\"`; quotes that directly follow it belong to the text
  (`\"\"\"say "hi"\"\"\"` is `say "hi"`), so the text cannot contain `\"\"\"` itself.

A JSON syntax error is reported with the line and column of the original file.
"""

from __future__ import annotations

import difflib
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from service.core.agents.definition import AgentDefinition
from service.core.errors import InvalidRequest

SCHEMA_FILE_NAME = "agent.schema.json"


@dataclass(frozen=True, slots=True)
class AgentIssue:
    """One problem in an agent file: where (field path and/or position) and why."""

    path: str
    reason: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = self.path
        if self.line is not None:
            position = f"line {self.line}, column {self.column}"
            where = f"{where} (at {position})" if where else position
        return f"{where}: {self.reason}" if where else self.reason


class AgentDefinitionError(InvalidRequest):
    """An agent file is not a valid agent definition; `issues` says where and why."""

    def __init__(self, issues: Sequence[AgentIssue], source: str | None = None) -> None:
        text = "; ".join(str(issue) for issue in issues)
        super().__init__(f"{source}: {text}" if source else text, file=source or "")
        self.issues = tuple(issues)
        self.source = source


# ---------------------------------------------------------------------------------------
# Reading a file


def load_agent_file(path: Path) -> AgentDefinition:
    """Read and validate one agent file; its key is the file name without `.json`."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AgentDefinitionError([AgentIssue("", f"not UTF-8 text ({exc})")], path.name) from exc
    return parse_agent_text(text, key=path.stem, source=path.name)


def parse_agent_text(text: str, *, key: str | None, source: str | None = None) -> AgentDefinition:
    """Validate an agent file's text; `key` is the file's key (None: the text must have one)."""
    try:
        data = parse_agent_json(text)
        if not isinstance(data, dict):
            raise AgentDefinitionError([AgentIssue("", "the file must hold one JSON object")])
        context = {"key": key} if key is not None else {}
        return AgentDefinition.model_validate(data, context=context)
    except AgentDefinitionError as exc:
        raise AgentDefinitionError(exc.issues, source) from None
    except ValidationError as exc:
        raise AgentDefinitionError(list(_issues_from(exc)), source) from None


def parse_agent_json(text: str) -> Any:
    """Parse the file's JSON after converting `\"\"\"` prompts; errors name original positions."""
    converted, replacements = convert_multiline_prompts(text)
    try:
        return json.loads(converted, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        line, column = _line_column(text, _original_offset(exc.pos, replacements))
        raise AgentDefinitionError(
            [AgentIssue("", f"invalid JSON: {exc.msg}", line, column)]
        ) from None
    except _DuplicateKey as exc:
        raise AgentDefinitionError([AgentIssue(exc.key, "duplicate key in one object")]) from None


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, value in pairs:
        if name in result:
            raise _DuplicateKey(name)
        result[name] = value
    return result


# (original start, original end, converted start, converted end) of each replaced text
Replacement = tuple[int, int, int, int]


def convert_multiline_prompts(text: str) -> tuple[str, list[Replacement]]:
    """Replace each `\"\"\"...\"\"\"` value by a JSON string; see the module docstring."""
    parts: list[str] = []
    replacements: list[Replacement] = []
    copied = converted_length = 0
    for start, end, key in _triple_quoted(text):
        if key is None or not key.lower().endswith("systemprompt"):
            line, column = _line_column(text, start)
            where = f" for key '{key}'" if key is not None else " outside a key's value"
            reason = f'""" text is not allowed{where}: only for keys ending in systemPrompt'
            raise AgentDefinitionError([AgentIssue(key or "", reason, line, column)])
        literal = json.dumps(_trim_multiline(text[start + 3 : end - 3]), ensure_ascii=False)
        parts.append(text[copied:start])
        converted_length += start - copied
        replacements.append((start, end, converted_length, converted_length + len(literal)))
        parts.append(literal)
        converted_length += len(literal)
        copied = end
    parts.append(text[copied:])
    return "".join(parts), replacements


def _triple_quoted(text: str) -> Iterator[tuple[int, int, str | None]]:
    """Yield (start, end, key) of each `\"\"\"` text; key is None unless it is a key's value."""
    last_string: str | None = None
    key: str | None = None
    previous = ""  # the last significant token: "string", ":" or another character
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if text.startswith('"""', i):
            close = text.find('"""', i + 3)
            if close < 0:
                line, column = _line_column(text, i)
                where = (key or "") if previous == ":" else ""
                issue = AgentIssue(where, 'unterminated """ text', line, column)
                raise AgentDefinitionError([issue])
            end = close + 3
            while end < n and text[end] == '"':
                end += 1
            yield i, end, key if previous == ":" else None
            i, previous = end, "value"
            continue
        if char == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            last_string, previous, i = _decode_string(text[i : j + 1]), "string", j + 1
            continue
        if char == ":":
            key = last_string if previous == "string" else None
            previous = ":"
        elif not char.isspace():
            previous = char
        i += 1


def _decode_string(literal: str) -> str:
    try:
        value = json.loads(literal)
    except json.JSONDecodeError:
        return literal.strip('"')
    return value if isinstance(value, str) else literal


def _trim_multiline(body: str) -> str:
    body = body.replace("\r\n", "\n").replace("\r", "\n")
    first_break = body.find("\n")
    if first_break >= 0 and not body[:first_break].strip():
        body = body[first_break + 1 :]
    last_break = body.rfind("\n")
    if last_break >= 0 and not body[last_break + 1 :].strip():
        body = body[:last_break]
    return body


def _original_offset(position: int, replacements: list[Replacement]) -> int:
    shift = 0
    for original_start, original_end, start, end in replacements:
        if position < start:
            break
        if position < end:
            return original_start
        shift = end - original_end
    return position - shift


def _line_column(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


# ---------------------------------------------------------------------------------------
# Validation errors → issues


def _issues_from(error: ValidationError) -> Iterator[AgentIssue]:
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        kind = item["type"]
        if kind == "agent_rule":
            for path, reason in item["ctx"]["issues"]:
                yield AgentIssue(_join_path((*loc, *path.split("."))), reason)
            continue
        if kind == "missing":
            reason = "is required"
        elif kind == "extra_forbidden":
            reason = "unknown key" + _suggestion(loc)
        else:
            reason = item["msg"].removeprefix("Value error, ")
            value = item.get("input")
            if isinstance(value, str | int | float | bool) and kind != "value_error":
                reason += f" (got {json.dumps(value, ensure_ascii=False)})"
        yield AgentIssue(_join_path(loc), reason)


def _join_path(loc: Sequence[str | int]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part:
            path += f".{part}" if path else part
    return path


def _suggestion(loc: Sequence[str | int]) -> str:
    """' (did you mean ...?)' for a misspelled key, from the keys its object allows."""
    model: type[BaseModel] | None = AgentDefinition
    for part in loc[:-1]:
        if model is None or isinstance(part, int):
            continue
        info = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        model = _model_of(info.annotation) if info is not None else None
    if model is None:
        return ""
    known = [f.alias or n for n, f in model.model_fields.items()]
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


# ---------------------------------------------------------------------------------------
# JSON Schema


def agent_json_schema() -> dict[str, Any]:
    """The JSON Schema of agent files (`agents/agent.schema.json`)."""
    schema = AgentDefinition.model_json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def agent_schema_text() -> str:
    """The exact content of `agents/agent.schema.json`."""
    return json.dumps(agent_json_schema(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":  # python -m service.core.agents.loader agents/agent.schema.json
    Path(sys.argv[1]).write_text(agent_schema_text(), encoding="utf-8")
