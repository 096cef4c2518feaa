"""Prompt variables: what a system prompt may name of the request that runs it.

A stage's `systemPrompt` may hold variables in the tool-argument templates' syntax
(service/core/tools/templates.py), filled in when the run calls the model:

| variable | value |
|---|---|
| `{{date}}` | the date the run started, `2025-03-01` (UTC) |
| `{{now}}` | the time the run started, `2025-03-01T04:30:00Z` (UTC, seconds) |
| `{{user}}` | the subject of the caller's credential; empty without authentication |
| `{{params}}`, `{{params.x}}` | the query's `params`, whole (JSON) or a field (`params.a.b`) |
| `{{scene}}`, `{{scene.x}}` | the query's `scene`, the same way |

As in tool arguments, a date shifts by whole days: `{{date+1d}}`, `{{params.due-7d}}`.
A field the query did not give is empty; a string field is its text, any other value
its JSON. `\\{{` writes `{{` itself. `{{date}}` and `{{now}}` are taken once, when the
run starts, and kept with it (a resumed run sees the same).

The variables are checked when the agent file loads: any other name, a field of
`date`, `now` or `user`, or `{{` that starts no variable is reported with the file,
the field and the variable. Rendering lives with the run (service/core/run/prompt.py).
"""

from __future__ import annotations

import re

#: Each variable's name → whether it takes a field path (`params.x`).
NAMES: dict[str, bool] = {"date": False, "now": False, "user": False, "params": True, "scene": True}

#: A variable, or the escaped braces `\{{`.
TOKEN = re.compile(
    r"\\\{\{|\{\{\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:\.(?P<path>[A-Za-z0-9_.-]+?))?"
    r"\s*(?:(?P<sign>[+-])\s*(?P<days>\d+)\s*d)?\s*\}\}"
)
_OPEN = re.compile(r"\\?\{\{")


def prompt_issues(text: str) -> list[str]:
    """What is wrong with the variables of a system prompt (empty: nothing)."""
    issues: list[str] = []
    known = ", ".join(NAMES)
    for opening in _OPEN.finditer(text):
        if opening.group().startswith("\\"):
            continue
        match = TOKEN.match(text, opening.start())
        if match is None:
            snippet = text[opening.start() : opening.start() + 24].split("\n")[0]
            issues.append(
                f"{snippet!r} starts no prompt variable (they are {known}, e.g. {{{{date}}}}, "
                "{{params.city}}); write \\{{ for literal braces"
            )
            continue
        name, path = match["name"], match["path"]
        if name not in NAMES:
            issues.append(
                f"unknown prompt variable {match.group()!r} (the variables are {known}; "
                "write \\{{ for literal braces)"
            )
        elif path and not NAMES[name]:
            issues.append(f"{match.group()!r}: {name} has no fields")
    return issues
