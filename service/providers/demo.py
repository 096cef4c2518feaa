"""The built-in demo model: an OpenAI-compatible streaming endpoint on loopback.

With no provider configured, the service starts a `LoopbackProvider` with this
responder and registers it as provider "demo", so the example agents answer
through the very same HTTP client and SSE parser a real provider uses. The
demo streams word by word, paced like a real model, and reasons first when the
request switches reasoning on.
"""

from __future__ import annotations

import re
from typing import Any

from service.providers import loopback as lb
from service.providers.demo_tools import tool_script

DEMO_KEY = "demo"
DEMO_MODEL = "agw-demo"
_WORDS = re.compile(r"\S+\s*")


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
    answer = (
        f"You said: “{said}”.\n\nThis answer comes from agw's built-in demo model, streamed "
        "word by word through the same OpenAI-compatible client a real provider uses. "
        "Configure a provider (see the README) to talk to a real model."
    )
    return reasoning, answer


def demo_responder(delay_s: float) -> lb.Responder:
    """A responder that streams `demo_reply` one word per chunk, `delay_s` apart."""

    def respond(body: dict[str, Any]) -> list[lb.ScriptItem]:
        with_tools = tool_script(body, delay_s)  # tool calls, and answers from their results
        if with_tools is not None:
            return with_tools
        reasoning, answer = demo_reply(body)
        script: list[lb.ScriptItem] = []
        for word in _words(reasoning):
            script += [lb.Pause(delay_s), lb.reasoning(word)]
        for word in _words(answer):
            script += [lb.Pause(delay_s), lb.content(word)]
        prompt = sum(len(str(m.get("content", ""))) for m in body.get("messages", [])) // 4
        completion = len(_words(reasoning)) + len(_words(answer))
        script += [
            lb.finish("stop"),
            lb.usage(prompt, completion, reasoning_tokens=len(_words(reasoning))),
            lb.DONE,
        ]
        return script

    return respond
