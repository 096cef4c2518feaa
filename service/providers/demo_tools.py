"""What the built-in demo model does with a request: call a tool, or answer.

The demo decides from the request's structure and the agent's script, never from
the wording of the prompts it is sent:

* the tools offered and `tool_choice` (`none`: answer; a named function: call it;
  `required`: call one), the planning tools by their names;
* the messages from the last user message on: the demo's own calls, their results;
* the agent's script, the body's `script` field (an agent file sets it with
  `modelConfig.extraBody: {"demo": {"script": {...}}}`):

      {"calls": [{"tool": "city_datetime"}, {"tool": "mock_city_weather"}],
       "plan": [{"task": "Find the local time", "calls": [{"tool": "city_datetime"}]}],
       "answer": "The text of the final answer."}

  `calls`: the tool calls to make, one per turn and in order, before answering
  (ONESHOT, REACT). Each call's `arguments` are optional: fields left out are filled
  from the tool's JSON Schema and the user's message. `plan` (PLAN_EXECUTE): the tasks
  recorded with `_plan_add_tasks_` (written out as a draft when the plan stage asks for
  text first); in the execute stage the current task is the one the last user message
  names last: it makes its `calls`, then reports with `_plan_update_task_` and the
  results. `answer`: the final answer, instead of a summary of the tool results.

Without a script the demo calls each offered tool once, in order, then sums up the
results; a plan has two general tasks, each calling the first tool offered.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from service.builtins.city_datetime import CITY_ZONES
from service.core.agents import PLAN_ADD_TASKS_TOOL, PLAN_UPDATE_TASK_TOOL

DEFAULT_CITY = "Shanghai"
GENERAL_TASKS = ("Work out the answer to the request", "Check the answer and note it")

Message = dict[str, Any]


class ScriptError(ValueError):
    """The demo script of a request is malformed."""


@dataclass(frozen=True, slots=True)
class ToolUse:
    """One scripted tool call: the tool, and the arguments given (the rest is filled)."""

    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Task:
    """One scripted plan task and the calls that carry it out."""

    description: str
    calls: tuple[ToolUse, ...] = ()


@dataclass(frozen=True, slots=True)
class Script:
    """What an agent wants the demo to do; `calls` None: each offered tool once."""

    calls: tuple[ToolUse, ...] | None = None
    plan: tuple[Task, ...] = ()
    answer: str = ""

    @classmethod
    def parse(cls, raw: Any) -> Script:
        """The script of a request body's `script` field (None: no script)."""
        if raw is None:
            return cls()
        data = _object(raw, "script")
        unknown = sorted(set(data) - {"calls", "plan", "answer"})
        if unknown:
            raise ScriptError(f"demo script: unknown field(s) {', '.join(unknown)}")
        calls = _uses(data["calls"], "calls") if "calls" in data else None
        plan = tuple(_task(item, f"plan[{i}]") for i, item in enumerate(_list(data, "plan")))
        answer = data.get("answer", "")
        if not isinstance(answer, str):
            raise ScriptError("demo script: answer must be a string")
        return cls(calls, plan, answer)


@dataclass(frozen=True, slots=True)
class Call:
    """The demo calls a tool."""

    name: str
    arguments: Any


@dataclass(frozen=True, slots=True)
class Answer:
    """The demo answers with text; `thought` is its reasoning when reasoning is on."""

    text: str
    thought: str


def decide(body: dict[str, Any], script: Script) -> Call | Answer | None:
    """The demo's turn for a request; None: no tool in play, the demo echoes the user."""
    since = _since_user(body.get("messages") or [])
    request = _text(since[0]) if since else ""
    tools = {
        t["function"]["name"]: t["function"]
        for t in body.get("tools") or []
        if isinstance(t, dict) and isinstance(t.get("function"), dict)
    }
    choice = body.get("tool_choice") or "auto"
    if tools and choice != "none":
        picked = _choose(tools, choice, since, request, script)
        if picked is not None:
            return picked
    if PLAN_ADD_TASKS_TOOL in tools:  # the plan as text first
        listed = "\n".join(f"{i}. {t}" for i, t in enumerate(_descriptions(script), 1))
        return Answer(f"My plan:\n{listed}", "Let me plan the steps.")
    results = [m for m in since if m.get("role") == "tool"]
    thought = f"I have {len(results)} tool result(s) to sum up."
    if script.answer:
        return Answer(script.answer, thought if results else "I have what I need to answer.")
    if not results:
        return None
    found = "\n".join(f"- {m.get('name') or 'tool'}: {_brief(m.get('content'))}" for m in results)
    answer = (
        f"Here is what I found:\n{found}\n\n(This answer comes from agw's built-in demo model.)"
    )
    return Answer(answer, thought)


def _choose(
    tools: dict[str, Message], choice: Any, since: list[Message], request: str, script: Script
) -> Call | None:
    """The call to make, or None to answer instead."""
    forced = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if forced == PLAN_UPDATE_TASK_TOOL:
        return Call(forced, _report(since))
    if forced in tools:
        return _call(tools, ToolUse(forced), request, since)
    if PLAN_ADD_TASKS_TOOL in tools:
        tasks = [{"description": d} for d in _descriptions(script)]
        return Call(PLAN_ADD_TASKS_TOOL, {"tasks": tasks})
    ordinary = [name for name in tools if name != PLAN_UPDATE_TASK_TOOL]
    if PLAN_UPDATE_TASK_TOOL in tools:
        task = _current_task(script.plan, request)
        uses = list(task.calls) if task else [ToolUse(ordinary[0])] if ordinary else []
    elif script.calls is not None:
        uses = list(script.calls)
    else:
        uses = [ToolUse(name) for name in ordinary]
    uses = [use for use in uses if use.tool in tools]
    made = sum(1 for m in since if m.get("role") == "assistant" and m.get("tool_calls"))
    if made < len(uses):
        return _call(tools, uses[made], request, since)
    if PLAN_UPDATE_TASK_TOOL in tools:
        return Call(PLAN_UPDATE_TASK_TOOL, _report(since))
    if choice == "required":
        return _call(tools, uses[0] if uses else ToolUse(ordinary[0]), request, since)
    return None


def _call(tools: dict[str, Message], use: ToolUse, request: str, since: list[Message]) -> Call:
    filled = _fill(tools[use.tool].get("parameters") or {}, "", request, since)
    if isinstance(filled, dict):
        return Call(use.tool, {**filled, **use.arguments})
    return Call(use.tool, use.arguments or filled)


def _descriptions(script: Script) -> list[str]:
    return [task.description for task in script.plan] or list(GENERAL_TASKS)


def _current_task(plan: tuple[Task, ...], text: str) -> Task | None:
    """The task of the plan that `text` names last (None: it names none)."""
    named = [(text.rfind(task.description), task) for task in plan]
    position, task = max(named, key=lambda pair: pair[0], default=(-1, None))
    return task if position >= 0 else None


def _report(since: list[Message]) -> dict[str, str]:
    results = [_brief(m.get("content")) for m in since if m.get("role") == "tool"]
    return {"status": "completed", "result": "; ".join(results) if results else "done"}


def _fill(schema: dict[str, Any], name: str, request: str, since: list[Message]) -> Any:
    """A value for `schema` (a property called `name`), from the user's message."""
    if schema.get("enum"):
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties") or {}
        return {k: _fill(v, k, request, since) for k, v in properties.items()}
    if kind == "array":
        return [_fill(schema.get("items") or {}, name, request, since)]
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return True
    key = name.lower()
    if "city" in key:
        lowered = request.lower()
        found = [c for c in CITY_ZONES if c.isascii() and c in lowered]
        return max(found, key=len).title() if found else DEFAULT_CITY
    if "date" in key:
        if any(m.get("role") == "tool" and m.get("name") == "city_datetime" for m in since):
            shift = "+1d" if "tomorrow" in request.lower() else ""
            return "{{city_datetime.date" + shift + "}}"
        return date.today().isoformat()
    if "command" in key:
        return "echo hello from the sandbox; pwd"
    return " ".join(request.split())[:200] or "demo"


def _since_user(messages: list[Message]) -> list[Message]:
    """The messages from the last user message on (that message first)."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return messages[index:]
    return []


def _text(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def _brief(content: Any) -> str:
    text = str(content or "")
    try:
        value = json.loads(text)
    except ValueError:
        return text[:200]
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in list(value.items())[:6])
    return json.dumps(value, ensure_ascii=False)[:200]


# -- reading the script ----------------------------------------------------------------


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ScriptError(f"demo script: {where} must be an object")
    return value


def _list(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise ScriptError(f"demo script: {key} must be a list")
    return value


def _uses(value: Any, where: str) -> tuple[ToolUse, ...]:
    if not isinstance(value, list):
        raise ScriptError(f"demo script: {where} must be a list")
    uses = []
    for index, item in enumerate(value):
        data = _object(item, f"{where}[{index}]")
        tool, arguments = data.get("tool"), data.get("arguments", {})
        if not isinstance(tool, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", tool):
            raise ScriptError(f"demo script: {where}[{index}].tool must be a tool name")
        uses.append(ToolUse(tool, _object(arguments, f"{where}[{index}].arguments")))
    return tuple(uses)


def _task(value: Any, where: str) -> Task:
    data = _object(value, where)
    description = data.get("task")
    if not isinstance(description, str) or not description.strip():
        raise ScriptError(f"demo script: {where}.task must be a non-empty string")
    return Task(description.strip(), _uses(data.get("calls", []), f"{where}.calls"))
