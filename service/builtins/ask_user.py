"""The built-in `ask_user` tool: the model asks the user a question and waits for the answer.

For clarifications ("which city?") and decisions ("overwrite the file?"): the
client shows `question.ask` with its options and answers through Submit.
"""

from __future__ import annotations

from typing import Any

from service.core.tools.definitions import ToolDefinition, ToolError
from service.core.tools.registry import BackendTool, ToolCallInfo

NAME = "ask_user"


async def ask_user(arguments: dict[str, Any], call: ToolCallInfo) -> Any:
    question = arguments.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ToolError("'question' must be a non-empty string")
    options = arguments.get("options") or []
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        raise ToolError("'options' must be a list of strings")
    if call.ask is None:
        raise ToolError("this run cannot ask the user")
    return await call.ask(question, options)


def ask_user_tool(wait_timeout_s: float) -> BackendTool:
    definition = ToolDefinition(
        name=NAME,
        kind="backend",
        description=(
            "Ask the user a question and wait for the answer: to clarify the request or to "
            "let the user decide. Give options when the answer is a choice."
        ),
        parameters={
            "type": "object",
            "properties": {
                "question": {"type": "string", "description": "The question."},
                "options": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Answers to choose from (omit for a free answer).",
                },
            },
            "required": ["question"],
        },
        after_call_hint="Go on with the user's answer.",
        timeout_s=wait_timeout_s + 5,  # the wait for the answer has its own time-out
    )
    return BackendTool(definition, ask_user)
