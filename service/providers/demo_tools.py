"""Tool calling for the built-in demo model, so that agents with tools run end to end.

When a request offers tools, the demo behaves like a (very simple) model that uses
them: it follows `tool_choice` (a named function, `required`, `none`), calls each
offered tool once — one call per turn, arguments filled from the tool's JSON
Schema and the user's message, streamed in several fragments — and once every
tool has answered, sums the results up. PLAN_EXECUTE's planning tools get
sensible arguments: one task per executor tool (listed in the plan prompt), and
a report of the current task once it used a tool. After tool results, or to
check an answer (SECOND_PASS_FIX), it answers from what it has.
"""

from __future__ import annotations

import json
import re
import secrets
from datetime import date
from typing import Any

from service.builtins.city_datetime import CITY_ZONES
from service.core.agents import PLAN_ADD_TASKS_TOOL, PLAN_UPDATE_TASK_TOOL
from service.core.modes.plan_execute import GENERATE_INSTRUCTION, PLAN_REPAIR, UPDATE_REPAIR
from service.core.policies import VERIFY_INSTRUCTION
from service.core.tools.planning import EXECUTOR_TOOLS_HEADING, RESULTS_HEADING, TASK_ID_LINE
from service.providers import loopback as lb

_WORDS = re.compile(r"\S+\s*")
_FRAGMENT = 12  # characters of JSON arguments per streamed fragment
DEFAULT_CITY = "Shanghai"

Message = dict[str, Any]


def tool_script(body: dict[str, Any], delay_s: float) -> list[lb.ScriptItem] | None:
    """The demo's turn when tools are in play; None to let it answer as usual."""
    messages: list[Message] = body.get("messages") or []
    recent = _since_user(messages)
    if recent and _text(recent[0]) == VERIFY_INSTRUCTION:
        return _speak(body, delay_s, "I checked my answer.", _last_answer(messages))
    request = _text(recent[0]) if recent else ""
    if RESULTS_HEADING in request and not body.get("tools"):  # PLAN_EXECUTE's summary
        outline = request.split(RESULTS_HEADING, 1)[1].split("\n\n")[0].strip()
        answer = f"Here is what the plan found:\n{outline}"
        return _speak(body, delay_s, "Let me sum up the tasks.", answer)
    tools = {
        t["function"]["name"]: t["function"]
        for t in body.get("tools") or []
        if isinstance(t, dict) and isinstance(t.get("function"), dict)
    }
    choice = body.get("tool_choice") or "auto"
    picked = _choose(messages, recent, tools, choice) if tools and choice != "none" else None
    if picked is None:
        if PLAN_ADD_TASKS_TOOL in tools:  # a deep-thinking draft
            tasks = "\n".join(f"{i}. {t}" for i, t in enumerate(_plan(messages), 1))
            return _speak(body, delay_s, "Let me plan the steps.", f"My plan:\n{tasks}")
        results = [m for m in recent if m.get("role") == "tool"]
        if not results:
            return None
        answer = "Here is what I found:\n" + "\n".join(
            f"- {m.get('name') or 'tool'}: {_brief(m.get('content'))}" for m in results
        )
        answer += "\n\n(This answer comes from agw's built-in demo model.)"
        return _speak(body, delay_s, f"I have {len(results)} tool result(s) to sum up.", answer)
    name, arguments = picked
    text = json.dumps(arguments, ensure_ascii=False)
    script: list[lb.ScriptItem] = []
    if _wants_reasoning(body):
        for word in _WORDS.findall(f"I will call {name} to get what I need."):
            script += [lb.Pause(delay_s), lb.reasoning(word)]
    call_id = "call_" + secrets.token_hex(12)
    script += [lb.Pause(delay_s), lb.tool_call(0, call_id, name)]
    for start in range(0, len(text), _FRAGMENT):
        script += [lb.Pause(delay_s), lb.tool_call(0, arguments=text[start : start + _FRAGMENT])]
    script += [lb.finish("tool_calls"), _usage(body, len(text) // 4), lb.DONE]
    return script


def _choose(
    messages: list[Message], recent: list[Message], tools: dict[str, Message], choice: Any
) -> tuple[str, Any] | None:
    """The tool to call and its arguments, or None to answer instead."""
    called = [
        call.get("function", {}).get("name")
        for m in recent
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or []
    ]
    forced = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    names = list(tools)
    if PLAN_ADD_TASKS_TOOL in tools:
        return PLAN_ADD_TASKS_TOOL, {"tasks": [{"description": t} for t in _plan(messages)]}
    if forced == PLAN_UPDATE_TASK_TOOL or (PLAN_UPDATE_TASK_TOOL in tools and called):
        return PLAN_UPDATE_TASK_TOOL, _report(messages, recent)
    if forced in tools:
        return forced, _fill(tools[forced].get("parameters") or {}, "", messages, recent)
    if PLAN_UPDATE_TASK_TOOL in tools:
        ordinary = [n for n in names if n != PLAN_UPDATE_TASK_TOOL]
        if not ordinary:
            return PLAN_UPDATE_TASK_TOOL, _report(messages, recent)
        task = _text(recent[0]) if recent else ""
        named = [n for n in ordinary if n in task]
        pick = named[0] if named else ordinary[0]
        return pick, _fill(tools[pick].get("parameters") or {}, "", messages, recent)
    uncalled = [n for n in names if n not in called]
    if not uncalled and choice != "required":
        return None
    pick = uncalled[0] if uncalled else names[0]
    return pick, _fill(tools[pick].get("parameters") or {}, "", messages, recent)


def _plan(messages: list[Message]) -> list[str]:
    """One task per executor tool listed in the plan prompt, else two general ones."""
    system = _text(messages[0]) if messages and messages[0].get("role") == "system" else ""
    _, _, listed = system.partition(EXECUTOR_TOOLS_HEADING)
    tools = re.findall(r"^- ([A-Za-z0-9_-]+):", listed, re.MULTILINE)
    if tools:
        return [f"Use {name} for what the request needs" for name in tools]
    request = _request(messages)
    return [f"Work out the answer to: {request}", "Check the answer and note it"]


def _report(messages: list[Message], recent: list[Message]) -> dict[str, str]:
    briefs = " ".join(_text(m) for m in messages if m.get("role") == "user")
    found = re.search(re.escape(TASK_ID_LINE) + r"(\S+)", briefs)
    results = [_brief(m.get("content")) for m in recent if m.get("role") == "tool"]
    result = "; ".join(results) if results else "done"
    return {"taskId": found[1] if found else "", "status": "completed", "result": result}


def _fill(schema: dict[str, Any], name: str, messages: list[Message], recent: list[Message]) -> Any:
    """A value for `schema` (a property called `name`), from the conversation."""
    if schema.get("enum"):
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties") or {}
        return {k: _fill(v, k, messages, recent) for k, v in properties.items()}
    if kind == "array":
        return [_fill(schema.get("items") or {}, name, messages, recent)]
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return True
    key, request = name.lower(), _request(messages)
    if "city" in key:
        lowered = request.lower()
        found = [c for c in CITY_ZONES if c.isascii() and c in lowered]
        return max(found, key=len).title() if found else DEFAULT_CITY
    if "date" in key:
        if any(m.get("role") == "tool" and m.get("name") == "city_datetime" for m in recent):
            return (
                "{{city_datetime.date+1d}}"
                if "tomorrow" in request.lower()
                else ("{{city_datetime.date}}")
            )
        return date.today().isoformat()
    if "command" in key:
        return "echo hello from the sandbox; pwd"
    return request[:200] or "demo"


def _speak(body: dict[str, Any], delay_s: float, thought: str, answer: str) -> list[lb.ScriptItem]:
    script: list[lb.ScriptItem] = []
    if _wants_reasoning(body):
        for word in _WORDS.findall(thought):
            script += [lb.Pause(delay_s), lb.reasoning(word)]
    for word in _WORDS.findall(answer):
        script += [lb.Pause(delay_s), lb.content(word)]
    return [*script, lb.finish("stop"), _usage(body, len(script) // 2), lb.DONE]


def _usage(body: dict[str, Any], completion: int) -> dict[str, Any]:
    prompt = sum(len(str(m.get("content", ""))) for m in body.get("messages", [])) // 4
    return lb.usage(prompt, completion)


def _since_user(messages: list[Message]) -> list[Message]:
    """The messages from the last user message on (that message first)."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return messages[index:]
    return []


def _last_answer(messages: list[Message]) -> str:
    for message in reversed(messages):
        if message.get("role") == "assistant" and _text(message):
            return _text(message)
    return "I have nothing to add."


def _request(messages: list[Message]) -> str:
    """The user's request: the last user message that is not an instruction of a mode."""
    instructions = (GENERATE_INSTRUCTION, PLAN_REPAIR, UPDATE_REPAIR.split("{")[0])
    for message in reversed(messages):
        text = " ".join(_text(message).split())
        if message.get("role") == "user" and not text.startswith(instructions):
            return text
    return ""


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


def _wants_reasoning(body: dict[str, Any]) -> bool:
    kwargs = body.get("chat_template_kwargs") or {}
    return bool(
        body.get("enable_thinking")
        or body.get("think")
        or body.get("reasoning_effort")
        or kwargs.get("enable_thinking")
    )
