"""What the built-in demo model does with a request: call a tool, or answer.

The demo decides from the request's structure and the agent's script, never from
the wording of the prompts it is sent; of the user's words it reads only the cities
they name:

* the tools offered and `tool_choice` (`none`: answer; a named function: call it;
  `required`: call one), the planning tools by their names;
* the messages from the last user message on: the demo's own calls, their results;
* the agent's script, the body's `script` field (an agent file sets it with
  `modelConfig.extraBody: {"demo": {"script": {...}}}`):

      {"calls": [{"tool": "city_datetime"}, {"tool": "mock_city_weather"}],
       "plan": [{"task": "Find the local time", "calls": [{"tool": "city_datetime"}]}],
       "replan": [{"decision": "revise", "reason": "...", "plan": [...]}],
       "verify": [{"verdict": "needsMorePlanning", "improvements": ["..."], "plan": [...]}],
       "answer": "The text of the final answer."}

  `calls`: the tool calls to make, one per turn and in order, before answering
  (ONESHOT, REACT). Each call's `arguments` are optional: fields left out are filled
  from the tool's JSON Schema and the user's message. `plan` (PLAN_EXECUTE): the tasks
  recorded with `_plan_add_tasks_` (written out as a draft when the plan stage asks for
  text first), each optionally with its `dependsOn`, `expectedOutput` and
  `requiredTools`; in the execute stage the current task is the one the last user
  message names last (of every task of the script): it makes its `calls`, then reports
  with `_plan_update_task_` and the results. `replan`: the replanner's decisions with
  `_plan_decide_`, in order (then: continue); a `revise` gives its new tasks in `plan`.
  `verify`: the verifier's verdicts with `_plan_verify_`, in order (then: pass); after
  a `needsMorePlanning`, the next planning round records its `plan`. The rounds are
  counted by the demo's earlier calls of each tool in the request's messages.
  `answer`: the final answer, instead of a summary of the tool results.

  Any text of the script may say `{city}`, `{city2}` (the first and second city the user
  names) and `{zone}` (the first city's IANA time zone): the cities are those of the
  latest user message that names any, in the order named (a known city in any case,
  else a capitalised name not starting a sentence), else Shanghai and Paris. Tool
  arguments called `city` that the script leaves out get the first.

Every answer says in its first line that it comes from the demo model.

Without a script the demo calls each offered tool once, in order, then sums up the
results; a plan has two general tasks, each calling the first tool offered.

Asked to summarise earlier turns (the `_context_summary_` tool is offered, see
service/core/run/window.py), the demo lists what the user said in them, from the
transcript's `user:` lines.
"""

from __future__ import annotations

import calendar
import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from service.builtins.city_datetime import CITY_ZONES, zone_name
from service.core.tools.names import (
    CONTEXT_SUMMARY_TOOL,
    PLAN_ADD_TASKS_TOOL,
    PLAN_DECIDE_TOOL,
    PLAN_UPDATE_TASK_TOOL,
    PLAN_VERIFY_TOOL,
)

#: The first line of every answer of the demo.
DEMO_LINE = "_Demo answer: agw's built-in demo model, not a real LLM._"
#: `{city}` and `{city2}` when the user names no city (or one).
DEFAULT_CITIES = ("Shanghai", "Paris")
DEFAULT_CITY = DEFAULT_CITIES[0]
GENERAL_TASKS = ("Work out the answer to the request", "Check the answer and note it")
DEFAULT_REASONS = {
    "continue": "The remaining steps still fit.",
    "revise": "Another way suits this better.",
    "finish": "All that was asked is known now.",
}

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
    """One scripted plan task, the calls that carry it out, and how it is planned."""

    description: str
    calls: tuple[ToolUse, ...] = ()
    depends_on: tuple[str | int, ...] = ()
    expected_output: str = ""
    required_tools: tuple[str, ...] = ()

    def planned(self) -> dict[str, Any]:
        """The task as the demo records it in a planning call."""
        out: dict[str, Any] = {"description": self.description}
        if self.depends_on:
            out["dependsOn"] = list(self.depends_on)
        if self.expected_output:
            out["expectedOutput"] = self.expected_output
        if self.required_tools:
            out["requiredTools"] = list(self.required_tools)
        return out


@dataclass(frozen=True, slots=True)
class Decision:
    """One scripted decision of the replanner."""

    decision: str
    reason: str = ""
    plan: tuple[Task, ...] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    """One scripted verdict of the verifier, and the tasks of the planning round it asks for."""

    verdict: str
    improvements: tuple[str, ...] = ()
    reason: str = ""
    plan: tuple[Task, ...] = ()


@dataclass(frozen=True, slots=True)
class Script:
    """What an agent wants the demo to do; `calls` None: each offered tool once."""

    calls: tuple[ToolUse, ...] | None = None
    plan: tuple[Task, ...] = ()
    answer: str = ""
    replan: tuple[Decision, ...] = ()
    verify: tuple[Verdict, ...] = ()

    @classmethod
    def parse(cls, raw: Any) -> Script:
        """The script of a request body's `script` field (None: no script)."""
        if raw is None:
            return cls()
        data = _object(raw, "script")
        unknown = sorted(set(data) - {"calls", "plan", "answer", "replan", "verify"})
        if unknown:
            raise ScriptError(f"demo script: unknown field(s) {', '.join(unknown)}")
        calls = _uses(data["calls"], "calls") if "calls" in data else None
        plan = _tasks(data, "plan", "plan")
        answer = data.get("answer", "")
        if not isinstance(answer, str):
            raise ScriptError("demo script: answer must be a string")
        replan = tuple(_decision(d, f"replan[{i}]") for i, d in enumerate(_list(data, "replan")))
        verify = tuple(_verdict(v, f"verify[{i}]") for i, v in enumerate(_list(data, "verify")))
        return cls(calls, plan, answer, replan, verify)

    def tasks(self) -> tuple[Task, ...]:
        """Every task of the script: the plan's, the revisions', the later rounds'."""
        return (
            self.plan
            + tuple(t for d in self.replan for t in d.plan)
            + tuple(t for v in self.verify for t in v.plan)
        )

    def round_plan(self, index: int) -> tuple[Task, ...]:
        """The tasks of planning round `index` (0: the first; then after each verdict)."""
        if 0 < index <= len(self.verify) and self.verify[index - 1].plan:
            return self.verify[index - 1].plan
        return self.plan


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
    messages = body.get("messages") or []
    since = _since_user(messages)
    request = _text(since[0]) if since else ""
    places = Places.named_in(messages)
    script = _filled(script, places.fill)
    tools = {
        t["function"]["name"]: t["function"]
        for t in body.get("tools") or []
        if isinstance(t, dict) and isinstance(t.get("function"), dict)
    }
    choice = body.get("tool_choice") or "auto"
    earlier = _called(body.get("messages") or [])
    if tools and choice != "none":
        picked = _choose(tools, choice, since, request, script, earlier, places)
        if picked is not None:
            return picked
    if PLAN_ADD_TASKS_TOOL in tools:  # the plan as text first
        descriptions = _descriptions(script, earlier.count(PLAN_ADD_TASKS_TOOL))
        listed = "\n".join(f"{i}. {t}" for i, t in enumerate(descriptions, 1))
        return Answer(demo_text(f"My plan:\n{listed}"), "Let me plan the steps.")
    results = [m for m in since if m.get("role") == "tool"]
    thought = f"I have {len(results)} tool result(s) to sum up."
    if script.answer:
        answered = thought if results else "I have what I need to answer."
        return Answer(demo_text(script.answer), answered)
    if not results:
        return None
    found = "\n".join(_finding(m) for m in results)
    lead = "Here is what the tools found:"
    if not places.named and any(_city_of(m) == DEFAULT_CITY for m in results):
        lead = f"You named no city I could make out, so I looked up {DEFAULT_CITY}:"
    return Answer(demo_text(f"{lead}\n{found}"), thought)


def demo_text(text: str) -> str:
    """An answer of the demo: `text` after the line that says it is the demo's."""
    return f"{DEMO_LINE}\n\n{text}"


def _finding(message: Message) -> str:
    """One tool result as a line of the demo's summary (the built-ins' in words)."""
    name = str(message.get("name") or "tool")
    text = str(message.get("content") or "")
    if text.startswith("Error: "):
        return f"- **{name}** could not answer: {text.removeprefix('Error: ')[:300]}"
    value = _json(text)
    keys = set(value) if isinstance(value, dict) else set()
    if name == "city_datetime" and keys >= {"city", "time", "weekday", "date", "timezone"}:
        return (
            f"- **Local time in {value.get('city')}**: {str(value['time'])[:5]} on "
            f"{value.get('weekday')}, {value.get('date')} ({value.get('timezone')}, "
            f"UTC{value.get('utcOffset')})"
        )
    if name == "mock_city_weather" and keys >= {"city", "date", "condition", "tempHighC"}:
        return (
            f"- **Weather in {value.get('city')}** on {value.get('date')}: "
            f"{value['condition']}, {value.get('tempLowC')} to {value.get('tempHighC')} °C, "
            f"humidity {value.get('humidityPct')}%, wind {value.get('windKph')} km/h "
            "(made-up demo data)"
        )
    return f"- **{name}**: {_brief(text)}"


def _city_of(message: Message) -> Any:
    value = _json(str(message.get("content") or ""))
    return value.get("city") if isinstance(value, dict) else None


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Places:
    """The cities the user names, in order; the script's `{city}`, `{city2}`, `{zone}`."""

    named: tuple[str, ...] = ()

    @classmethod
    def named_in(cls, messages: list[Message]) -> Places:
        """The cities of the latest user message that names any."""
        for message in reversed(messages):
            if message.get("role") == "user":
                named = cities_named(_text(message))
                if named:
                    return cls(named)
        return cls()

    def city(self, index: int = 0) -> str:
        """The `index`-th city named (from 0), else a default one not named."""
        spare = [c for c in DEFAULT_CITIES if c not in self.named]
        chosen = [*self.named, *spare]
        return chosen[min(index, len(chosen) - 1)]

    def fill(self, text: str) -> str:
        """`text` with its placeholders replaced."""
        return _PLACEHOLDER.sub(lambda m: self._value(m.group(1)), text)

    def _value(self, name: str) -> str:
        if name == "zone":
            return zone_name(self.city()) or "UTC"
        return self.city(1 if name == "city2" else 0)


_PLACEHOLDER = re.compile(r"\{(city2|city|zone)\}")
#: A known city, in any case, not inside a word (a name in Chinese characters anywhere).
_KNOWN = re.compile(
    "|".join(
        rf"(?<!\w){re.escape(c)}(?!\w)" if c.isascii() else re.escape(c)
        for c in sorted(CITY_ZONES, key=len, reverse=True)
    ),
    re.IGNORECASE,
)
#: A run of capitalised words (a proper name, maybe a city the tools know by its zone).
_TITLED = re.compile(r"(?<![\w'’])[A-Z][a-z'’]+(?:[ -][A-Z][a-z'’]+)*(?![\w'’])")
#: Capitalised words that are not places.
_SEASONS_AND_WORDS = ("Spring", "Summer", "Autumn", "Winter", "I", "Today", "Tomorrow")
_NOT_PLACES = frozenset(
    (*calendar.day_name, *calendar.month_name[1:], *_SEASONS_AND_WORDS, "Tonight", "Demo")
)
_SENTENCE_END = ".!?:;\n"


def cities_named(text: str) -> tuple[str, ...]:
    """The cities `text` names, in order: known ones in any case, else capitalised names
    that do not start a sentence."""
    found: list[tuple[int, str]] = []
    taken: set[int] = set()
    for match in _KNOWN.finditer(text):
        name = match.group(0)
        shown = (
            name if name[:1].isupper() else " ".join(w[:1].upper() + w[1:] for w in name.split(" "))
        )
        found.append((match.start(), shown))
        taken.update(range(match.start(), match.end()))
    for match in _TITLED.finditer(text):
        start, words = match.start(), match.group(0).split(" ")
        before = text[:start].rstrip(" \t\"'“‘(")
        if not before or before[-1] in _SENTENCE_END:  # capitalised as a sentence's start
            start += len(words.pop(0)) + 1
        while words and words[0] in _NOT_PLACES:
            start += len(words.pop(0)) + 1
        while words and words[-1] in _NOT_PLACES:
            words.pop()
        if words and start not in taken:
            found.append((start, " ".join(words)))
    named: list[str] = []
    for _, name in sorted(found):
        if name.lower() not in {n.lower() for n in named}:
            named.append(name)
    return tuple(named)


def _filled(value: Any, fill: Callable[[str], str]) -> Any:
    """`value` (a script, or a part of it) with `fill` applied to every text in it."""
    if isinstance(value, str):
        return fill(value)
    if isinstance(value, tuple):
        return tuple(_filled(v, fill) for v in value)
    if isinstance(value, list):
        return [_filled(v, fill) for v in value]
    if isinstance(value, dict):
        return {k: _filled(v, fill) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _filled(getattr(value, f.name), fill) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **changes)
    return value


def _choose(
    tools: dict[str, Message],
    choice: Any,
    since: list[Message],
    request: str,
    script: Script,
    earlier: list[str],
    places: Places,
) -> Call | None:
    """The call to make, or None to answer instead; `earlier`: the tools called so far."""
    forced = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if CONTEXT_SUMMARY_TOOL in tools:
        return Call(CONTEXT_SUMMARY_TOOL, {"summary": _summary(request)})
    if forced == PLAN_UPDATE_TASK_TOOL:
        return Call(forced, _report(since))
    if forced in tools:
        return _call(tools, ToolUse(forced), request, since, places)
    if PLAN_ADD_TASKS_TOOL in tools:
        planned = script.round_plan(earlier.count(PLAN_ADD_TASKS_TOOL))
        tasks = [t.planned() for t in planned] or [{"description": d} for d in GENERAL_TASKS]
        return Call(PLAN_ADD_TASKS_TOOL, {"tasks": tasks})
    if PLAN_DECIDE_TOOL in tools:
        return Call(PLAN_DECIDE_TOOL, _decide(script, earlier.count(PLAN_DECIDE_TOOL)))
    if PLAN_VERIFY_TOOL in tools:
        return Call(PLAN_VERIFY_TOOL, _verdict_of(script, earlier.count(PLAN_VERIFY_TOOL)))
    ordinary = [name for name in tools if name != PLAN_UPDATE_TASK_TOOL]
    if PLAN_UPDATE_TASK_TOOL in tools:
        task = _current_task(script.tasks(), request)
        uses = list(task.calls) if task else [ToolUse(ordinary[0])] if ordinary else []
    elif script.calls is not None:
        uses = list(script.calls)
    else:
        uses = [ToolUse(name) for name in ordinary]
    uses = [use for use in uses if use.tool in tools]
    made = sum(1 for m in since if m.get("role") == "assistant" and m.get("tool_calls"))
    if made < len(uses):
        return _call(tools, uses[made], request, since, places)
    if PLAN_UPDATE_TASK_TOOL in tools:
        return Call(PLAN_UPDATE_TASK_TOOL, _report(since))
    if choice == "required":
        use = uses[0] if uses else ToolUse(ordinary[0])
        return _call(tools, use, request, since, places)
    return None


def _call(
    tools: dict[str, Message], use: ToolUse, request: str, since: list[Message], places: Places
) -> Call:
    filled = _fill(tools[use.tool].get("parameters") or {}, "", request, since, places)
    if isinstance(filled, dict):
        return Call(use.tool, {**filled, **use.arguments})
    return Call(use.tool, use.arguments or filled)


def _summary(transcript: str) -> str:
    """The demo's summary of a transcript of earlier turns: what the user said in them."""
    lines = transcript.split("\n")
    said = [line.removeprefix("user:").strip() for line in lines if line.startswith("user:")]
    if not said:
        return "Nothing of note was said earlier."
    return "Earlier, the user said: " + "; ".join(f"“{text[:80]}”" for text in said) + "."


def _descriptions(script: Script, planning_round: int = 0) -> list[str]:
    return [task.description for task in script.round_plan(planning_round)] or list(GENERAL_TASKS)


def _called(messages: list[Message]) -> list[str]:
    """The names of the tools called in the request's assistant messages, in order."""
    return [
        str((call.get("function") or {}).get("name", ""))
        for message in messages
        if message.get("role") == "assistant"
        for call in message.get("tool_calls") or []
        if isinstance(call, dict)
    ]


def _decide(script: Script, index: int) -> dict[str, Any]:
    """The arguments of the replanner's decision number `index` (from 0)."""
    step = script.replan[index] if index < len(script.replan) else Decision("continue")
    out: dict[str, Any] = {
        "decision": step.decision,
        "reason": step.reason or DEFAULT_REASONS[step.decision],
    }
    if step.decision == "revise":
        out["tasks"] = [task.planned() for task in step.plan]
    return out


def _verdict_of(script: Script, index: int) -> dict[str, Any]:
    """The arguments of the verifier's verdict number `index` (from 0)."""
    step = script.verify[index] if index < len(script.verify) else Verdict("pass")
    out: dict[str, Any] = {"verdict": step.verdict}
    if step.improvements:
        out["improvements"] = list(step.improvements)
    if step.reason:
        out["reason"] = step.reason
    return out


def _current_task(plan: tuple[Task, ...], text: str) -> Task | None:
    """The task of the plan that `text` names last (None: it names none)."""
    named = [(text.rfind(task.description), task) for task in plan]
    position, task = max(named, key=lambda pair: pair[0], default=(-1, None))
    return task if position >= 0 else None


def _report(since: list[Message]) -> dict[str, str]:
    results = [_brief(m.get("content")) for m in since if m.get("role") == "tool"]
    return {"status": "completed", "result": "; ".join(results) if results else "done"}


def _fill(
    schema: dict[str, Any], name: str, request: str, since: list[Message], places: Places
) -> Any:
    """A value for `schema` (a property called `name`), from the user's message."""
    if schema.get("enum"):
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties") or {}
        return {k: _fill(v, k, request, since, places) for k, v in properties.items()}
    if kind == "array":
        return [_fill(schema.get("items") or {}, name, request, since, places)]
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return True
    key = name.lower()
    if "city" in key:
        return places.city()
    if "date" in key:
        if any(_answered(m, "city_datetime") for m in since):
            shift = "+1d" if "tomorrow" in request.lower() else ""
            return "{{city_datetime.date" + shift + "}}"
        return date.today().isoformat()
    if "command" in key:
        return "echo hello from the sandbox; pwd"
    return " ".join(request.split())[:200] or "demo"


def _answered(message: Message, tool: str) -> bool:
    """Whether `message` is a result of `tool` that is not an error."""
    return (
        message.get("role") == "tool"
        and message.get("name") == tool
        and not str(message.get("content") or "").startswith("Error: ")
    )


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


def _tasks(data: dict[str, Any], key: str, where: str) -> tuple[Task, ...]:
    return tuple(_task(item, f"{where}[{i}]") for i, item in enumerate(_list(data, key)))


def _task(value: Any, where: str) -> Task:
    data = _object(value, where)
    description = data.get("task")
    if not isinstance(description, str) or not description.strip():
        raise ScriptError(f"demo script: {where}.task must be a non-empty string")
    depends = data.get("dependsOn", [])
    if not isinstance(depends, list) or not all(
        isinstance(d, str) or (isinstance(d, int) and not isinstance(d, bool)) for d in depends
    ):
        raise ScriptError(f"demo script: {where}.dependsOn must be a list of ids or positions")
    expected = data.get("expectedOutput", "")
    if not isinstance(expected, str):
        raise ScriptError(f"demo script: {where}.expectedOutput must be text")
    tools = data.get("requiredTools", [])
    if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        raise ScriptError(f"demo script: {where}.requiredTools must be a list of tool names")
    calls = _uses(data.get("calls", []), f"{where}.calls")
    return Task(description.strip(), calls, tuple(depends), expected, tuple(tools))


def _decision(value: Any, where: str) -> Decision:
    data = _object(value, where)
    decision = data.get("decision")
    if decision not in DEFAULT_REASONS:
        raise ScriptError(f"demo script: {where}.decision must be continue, revise or finish")
    reason = data.get("reason", "")
    if not isinstance(reason, str):
        raise ScriptError(f"demo script: {where}.reason must be text")
    plan = _tasks(data, "plan", f"{where}.plan")
    if decision == "revise" and not plan:
        raise ScriptError(f"demo script: {where}.plan must list the tasks of the revision")
    return Decision(decision, reason, plan)


def _verdict(value: Any, where: str) -> Verdict:
    data = _object(value, where)
    verdict = data.get("verdict")
    if verdict not in ("pass", "needsMorePlanning"):
        raise ScriptError(f"demo script: {where}.verdict must be pass or needsMorePlanning")
    improvements = data.get("improvements", [])
    if not isinstance(improvements, list) or not all(isinstance(i, str) for i in improvements):
        raise ScriptError(f"demo script: {where}.improvements must be a list of strings")
    if verdict == "needsMorePlanning" and not improvements:
        raise ScriptError(f"demo script: {where}.improvements must name what is missing")
    reason = data.get("reason", "")
    if not isinstance(reason, str):
        raise ScriptError(f"demo script: {where}.reason must be text")
    plan = _tasks(data, "plan", f"{where}.plan")
    return Verdict(verdict, tuple(improvements), reason, plan)
