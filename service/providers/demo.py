"""The built-in demo model: an OpenAI-compatible streaming endpoint on loopback.

With no provider configured, the service starts a `LoopbackProvider` with this
responder and registers it as provider "demo", so the example agents answer
through the very same HTTP client and SSE parser a real provider uses. The
demo streams word by word, paced like a real model, and reasons first when the
request switches reasoning on.

What it does is decided by `demo_tools.decide` from the request's structure, the
cities the user names and the agent's script (the body's `script` field, set by an agent file with
`modelConfig.extraBody: {"demo": {"script": {...}}}`); with no tool in play and
no scripted answer, it echoes the user's message.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from service.core.tools.names import (
    CONTEXT_SUMMARY_TOOL,
    PLAN_ADD_TASKS_TOOL,
    PLAN_DECIDE_TOOL,
    PLAN_UPDATE_TASK_TOOL,
    PLAN_VERIFY_TOOL,
)
from service.providers import loopback as lb
from service.providers.demo_tools import Answer, Call, Script, decide, demo_text

DEMO_KEY = "demo"
DEMO_MODEL = "agw-demo"
SCRIPT_FIELD = "script"  # the body field carrying the agent's demo script
_WORDS = re.compile(r"\S+\s*")
_FRAGMENT = 12  # characters of JSON arguments per streamed fragment


def _wants_reasoning(body: dict[str, Any]) -> bool:
    kwargs = body.get("chat_template_kwargs") or {}
    return bool(
        body.get("enable_thinking")
        or body.get("think")
        or body.get("reasoning_effort")
        or kwargs.get("enable_thinking")
    )


def _last_user_message(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages", [])):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def _words(text: str) -> list[str]:
    return _WORDS.findall(text)


def demo_reply(body: dict[str, Any]) -> tuple[str, str]:
    """The demo's (reasoning, answer) to a chat-completions request."""
    said = " ".join(_last_user_message(body).split()) or "nothing"
    reasoning = (
        f"The user wrote: “{said}”. I am agw's built-in demo model, so I will echo the "
        "message and explain how to connect a real model."
        if _wants_reasoning(body)
        else ""
    )
    answer = demo_text(
        f"You said: “{said}”.\n\nI echo what you write, streamed word by word through the "
        "same OpenAI-compatible client a real provider uses. Configure a provider "
        "(docs/providers.md) to talk to a real model."
    )
    return reasoning, answer


def demo_responder(delay_s: float) -> lb.Responder:
    """A responder streaming the demo's turn one word (or argument fragment) per chunk."""

    def respond(body: dict[str, Any]) -> list[lb.ScriptItem]:
        turn = decide(body, Script.parse(body.get(SCRIPT_FIELD)))
        thinking = _wants_reasoning(body)
        if isinstance(turn, Call):
            thought = _intent(turn.name) if thinking else ""
            return _call(body, delay_s, thought, turn)
        if isinstance(turn, Answer):
            return _speak(body, delay_s, turn.thought if thinking else "", turn.text)
        return _speak(body, delay_s, *demo_reply(body))

    return respond


#: What the demo thinks before calling one of the tools the service adds itself.
_INTENTS = {
    PLAN_ADD_TASKS_TOOL: "I will record the plan.",
    PLAN_UPDATE_TASK_TOOL: "I will report how the task went.",
    PLAN_DECIDE_TOOL: "I will decide how the plan goes on.",
    PLAN_VERIFY_TOOL: "I will check the results against the request.",
    CONTEXT_SUMMARY_TOOL: "I will sum up the earlier turns.",
}


def _intent(tool: str) -> str:
    return _INTENTS.get(tool) or f"I will call {tool} to get what I need."


def _speak(body: dict[str, Any], delay_s: float, thought: str, answer: str) -> list[lb.ScriptItem]:
    script: list[lb.ScriptItem] = []
    for word in _words(thought):
        script += [lb.Pause(delay_s), lb.reasoning(word)]
    for word in _words(answer):
        script += [lb.Pause(delay_s), lb.content(word)]
    completion = len(_words(thought)) + len(_words(answer))
    usage = lb.usage(_prompt_tokens(body), completion, reasoning_tokens=len(_words(thought)))
    return [*script, lb.finish("stop"), usage, lb.DONE]


def _call(body: dict[str, Any], delay_s: float, thought: str, call: Call) -> list[lb.ScriptItem]:
    """The call streamed as a real model does: its id and name, then its arguments in pieces."""
    script: list[lb.ScriptItem] = []
    for word in _words(thought):
        script += [lb.Pause(delay_s), lb.reasoning(word)]
    text = json.dumps(call.arguments, ensure_ascii=False)
    script += [lb.Pause(delay_s), lb.tool_call(0, "call_" + secrets.token_hex(12), call.name)]
    for start in range(0, len(text), _FRAGMENT):
        script += [lb.Pause(delay_s), lb.tool_call(0, arguments=text[start : start + _FRAGMENT])]
    completion = len(_words(thought)) + len(text) // 4
    usage = lb.usage(_prompt_tokens(body), completion, reasoning_tokens=len(_words(thought)))
    return [*script, lb.finish("tool_calls"), usage, lb.DONE]


def _prompt_tokens(body: dict[str, Any]) -> int:
    return sum(len(str(m.get("content", ""))) for m in body.get("messages", [])) // 4
