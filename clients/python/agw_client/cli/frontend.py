"""A waiting frontend tool at the terminal: what it asks, and the answer typed for it.

A frontend tool (an `.html`, `.qlc` or `.dqlc` view) is meant to be rendered by a
page; at a terminal `agw` shows instead what such a view would show: the tool's
description (which says what answer it expects), the call's arguments (a list
of `options`/`choices` numbered), the view's address and static parameters, and
how to answer:

* an option's number picks that option (the option itself is the answer);
* text that is JSON is sent as that JSON value (`{"choice": "Yes"}`, `42`, `true`);
  integers stay integers;
* anything else is sent as the text itself.

When the tool declares the JSON Schema of its answer (`answerSchema`), the prompt shows
its shape, and an answer that is not an object, given to a tool expecting an object
with one field (`{"choice": string}`), becomes that field's value — so `1` or `Yes`
sends `{"choice": "Yes"}`, as the tool's page view would.
"""

from __future__ import annotations

import json
from typing import Any

from agw_client.cli.render import ToolCall, short

#: Argument names whose list of plain values is offered as numbered options.
OPTION_KEYS = ("options", "choices")
FIELD_WIDTH = 120


def parse_answer(text: str) -> Any:
    """A typed answer: JSON when it parses as JSON (NaN and infinities do not), else the text."""

    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    try:
        return json.loads(text, parse_constant=refuse)
    except ValueError:  # json.JSONDecodeError too
        return text


def arguments_of(call: ToolCall) -> Any:
    """The call's arguments as JSON, or the raw text when they are not JSON."""
    try:
        return json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        return call.arguments


def options_of(arguments: Any) -> list[Any]:
    """The options the call offers: its first `options`/`choices` list of plain values."""
    if not isinstance(arguments, dict):
        return []
    for key in OPTION_KEYS:
        values = arguments.get(key)
        if isinstance(values, list) and values and all(_plain(v) for v in values):
            return values
    return []


def describe(call: ToolCall) -> list[str]:
    """The lines shown above the prompt: the tool, its arguments, its view, the format."""
    lines = [f"? {call.name} ({call.type}) waits for your answer"]
    if call.description:
        lines.append("  " + " ".join(call.description.split()))
    arguments = arguments_of(call)
    options = options_of(arguments)
    if isinstance(arguments, dict):
        for key, value in arguments.items():
            if options and value is options:
                lines.append(f"  {key}:")
                lines += [f"    {n}. {_text(option)}" for n, option in enumerate(options, 1)]
            else:
                lines.append(f"  {key}: {short(value, FIELD_WIDTH)}")
    elif arguments:
        lines.append(f"  arguments: {short(arguments, FIELD_WIDTH)}")
    if call.api or call.params:
        params = json.dumps(call.params, ensure_ascii=False, sort_keys=True) if call.params else ""
        lines.append(f"  view: {call.api} {params}".rstrip())
    pick = "an option's number, " if options else ""
    if call.answer_schema:
        lines.append(f"  answer: {shape_of(call.answer_schema)}")
    lines.append(f'  answer with {pick}JSON ({{"key": "value"}}, 42, true) or plain text')
    return lines


def answer_of(text: str, options: list[Any], schema: dict[str, Any] | None = None) -> Any:
    """The payload for the typed `text`: a picked option, a JSON value, or the text —
    put in the one field of an object `schema` when it is not an object itself."""
    choice = text.strip()
    if options and choice.isdigit() and 1 <= int(choice) <= len(options):
        value = options[int(choice) - 1]
    else:
        value = parse_answer(text)
    field_name = _single_field(schema or {})
    if field_name and not isinstance(value, dict):
        return {field_name: value}
    return value


def shape_of(schema: dict[str, Any]) -> str:
    """A one-line picture of a JSON Schema: `{"choice": string}`, `integer`, `[string]`."""
    kind = schema.get("type")
    if "enum" in schema and isinstance(schema["enum"], list):
        return " | ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
    if kind == "object":
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties:
            return "object"
        fields = ", ".join(
            f"{json.dumps(name)}: {shape_of(sub) if isinstance(sub, dict) else 'any'}"
            for name, sub in properties.items()
        )
        return "{" + fields + "}"
    if kind == "array":
        items = schema.get("items")
        return f"[{shape_of(items) if isinstance(items, dict) else 'any'}]"
    return kind if isinstance(kind, str) else "any"


def _single_field(schema: dict[str, Any]) -> str:
    """The name of the only field of an object schema, or ""."""
    properties = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(properties, dict):
        return ""
    required = schema.get("required")
    names = required if isinstance(required, list) and len(required) == 1 else list(properties)
    return str(names[0]) if len(names) == 1 else ""


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
