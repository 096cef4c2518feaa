"""The built-in `ask_user` tool: the model asks the user a question and waits for the answer.

For clarifications ("which city?") and decisions ("overwrite the file?"): the
client shows `question.ask` with its options and answers through Submit. An
option is a label, or `{label, description, recommended}`; `multiSelect` lets
the user choose several (the answer is then the list of labels) and
`allowFreeText` lets them answer in their own words besides the options.
"""

from __future__ import annotations

from typing import Any

from service.core.run.questions import Option
from service.core.tools.definitions import ToolDefinition, ToolError
from service.core.tools.registry import BackendTool, ToolCallInfo

NAME = "ask_user"


def _option(value: Any, index: int) -> Option:
    if isinstance(value, str) and value.strip():
        return Option(value)
    if not isinstance(value, dict):
        raise ToolError(f"options[{index}] must be a label or an object with a label")
    label, description = value.get("label"), value.get("description", "")
    recommended = value.get("recommended", False)
    if not isinstance(label, str) or not label.strip():
        raise ToolError(f"options[{index}].label must be a non-empty string")
    if not isinstance(description, str):
        raise ToolError(f"options[{index}].description must be a string")
    if not isinstance(recommended, bool):
        raise ToolError(f"options[{index}].recommended must be true or false")
    return Option(label, description, recommended)


def _flag(arguments: dict[str, Any], name: str) -> bool:
    value = arguments.get(name, False)
    if not isinstance(value, bool):
        raise ToolError(f"'{name}' must be true or false")
    return value


async def ask_user(arguments: dict[str, Any], call: ToolCallInfo) -> Any:
    question = arguments.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ToolError("'question' must be a non-empty string")
    raw = arguments.get("options") or []
    if not isinstance(raw, list):
        raise ToolError("'options' must be a list of labels or {label, description} objects")
    options = [_option(value, index) for index, value in enumerate(raw)]
    labels = [option.label for option in options]
    if len(set(labels)) != len(labels):
        raise ToolError("'options' must not repeat a label")
    multi_select, free_text = _flag(arguments, "multiSelect"), _flag(arguments, "allowFreeText")
    if call.ask is None:
        raise ToolError("this run cannot ask the user")
    return await call.ask(question, options, multi_select=multi_select, allow_free_text=free_text)


def ask_user_tool(wait_timeout_s: float) -> BackendTool:
    definition = ToolDefinition(
        name=NAME,
        kind="backend",
        idempotent=True,  # asking again is what a resumed run should do
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
                    "description": "Answers to choose from (omit for a free answer).",
                    "items": {
                        "type": "object",
                        "properties": {
                            "label": {"type": "string", "description": "The answer as shown."},
                            "description": {
                                "type": "string",
                                "description": "What choosing it means.",
                            },
                            "recommended": {
                                "type": "boolean",
                                "description": "Whether you recommend it.",
                            },
                        },
                        "required": ["label"],
                    },
                },
                "multiSelect": {
                    "type": "boolean",
                    "description": "Let the user choose several options (default false).",
                },
                "allowFreeText": {
                    "type": "boolean",
                    "description": "Also accept an answer in the user's own words (default "
                    "false; always so without options).",
                },
            },
            "required": ["question"],
        },
        after_call_hint="Go on with the user's answer.",
        timeout_s=wait_timeout_s + 5,  # the wait for the answer has its own time-out
    )
    return BackendTool(definition, ask_user)
