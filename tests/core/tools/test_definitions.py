"""Tool files: the three kinds by suffix, the entry fields, clear errors for broken files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from service.core.tools.definitions import (
    ToolDefinitionError,
    load_tool_file,
    parse_tool_text,
)


def parse(tools: Any, suffix: str = ".backend") -> Any:
    return parse_tool_text(json.dumps({"tools": tools}), suffix, source=f"t{suffix}")


def error_of(text: str, suffix: str = ".backend") -> str:
    with pytest.raises(ToolDefinitionError) as caught:
        parse_tool_text(text, suffix, source=f"t{suffix}")
    return str(caught.value)


@pytest.mark.parametrize(
    ("suffix", "kind", "view"),
    [
        (".backend", "backend", "backend"),
        (".action", "action", "action"),
        (".html", "frontend", "html"),
        (".qlc", "frontend", "qlc"),
        (".dqlc", "frontend", "dqlc"),
    ],
)
def test_the_suffix_sets_the_kind(suffix: str, kind: str, view: str) -> None:
    (tool,) = parse([{"name": "t", "description": "A tool."}], suffix)
    assert (tool.kind, tool.view_type, tool.source) == (kind, view, f"t{suffix}")
    assert tool.parameters == {"type": "object", "properties": {}}


def test_an_entry_with_every_field() -> None:
    entry = {
        "name": "show_card",
        "description": "Show a card.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
        "after_call_hint": "  Describe the card.  ",
        "toolApi": "/views/card.html",
        "toolParams": {"width": 300},
    }
    (tool,) = parse([entry], ".html")
    assert (tool.name, tool.description, tool.after_call_hint) == (
        "show_card",
        "Show a card.",
        "Describe the card.",
    )
    assert (tool.tool_api, tool.tool_params) == ("/views/card.html", {"width": 300})
    assert tool.schema() == {
        "type": "function",
        "function": {
            "name": "show_card",
            "description": "Show a card.",
            "parameters": entry["parameters"],
        },
    }
    (camel,) = parse([{"name": "c", "description": "C.", "afterCallHint": "Say C."}])
    assert camel.after_call_hint == "Say C."
    (backend,) = parse([{"name": "b", "description": "B.", "timeoutMs": 2500}])
    assert backend.timeout_s == 2.5


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{", "t.backend: invalid JSON: Expecting property name enclosed in double quotes"),
        ("[]", "t.backend: Input should be a valid dictionary"),
        ('{"tools": {}}', "t.backend: tools: Input should be a valid list"),
        ('{"tool": []}', "t.backend: tools: is required; tool: unknown key"),
        ('{"tools": [{"description": "x"}]}', "t.backend: tools[0].name: is required"),
        (
            '{"tools": [{"name": "a b", "description": "x"}]}',
            "t.backend: tools[0].name: String should match pattern",
        ),
        ('{"tools": [{"name": "a", "description": ""}]}', "tools[0].description: String should"),
        ('{"tools": [{"name": "a", "description": "x", "colour": 1}]}', "tools[0].colour: unknown"),
        (
            '{"tools": [{"name": "a", "description": "x", "parameters": {"type": "string"}}]}',
            'tools[0].parameters.type: must be "object" (got "string")',
        ),
        (
            '{"tools": [{"name": "a", "description": "x", "parameters": {"required": ["q"]}}]}',
            "tools[0].parameters.required[0]: 'q' is not a property",
        ),
        (
            '{"tools": [{"name": "a", "description": "x"}, {"name": "a", "description": "y"}]}',
            "tools[1].name: duplicate tool name 'a' (see tools[0])",
        ),
    ],
)
def test_a_broken_file_names_the_entry_and_field(text: str, expected: str) -> None:
    assert expected in error_of(text)


def test_only_backend_tools_have_a_timeout() -> None:
    text = json.dumps({"tools": [{"name": "a", "description": "x", "timeoutMs": 5}]})
    assert "tools[0].timeoutMs: only backend tools have a time-out" in error_of(text, ".action")


def test_load_tool_file(tmp_path: Path) -> None:
    path = tmp_path / "ui.action"
    path.write_text(json.dumps({"tools": [{"name": "fireworks", "description": "Boom."}]}))
    assert [t.name for t in load_tool_file(path)] == ["fireworks"]
    path.write_bytes(b"\xff")
    with pytest.raises(ToolDefinitionError, match=r"^ui\.action: not UTF-8 text"):
        load_tool_file(path)


def test_a_frontend_view_and_answer_schema(tmp_path: Path) -> None:
    (tmp_path / "views").mkdir()
    (tmp_path / "views" / "card.html").write_text("<!doctype html><p>card</p>")
    (tmp_path / "secret.txt").write_text("no")
    answer = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    entry = {"name": "card", "description": "x", "view": "views/card.html", "answerSchema": answer}
    path = tmp_path / "card.html"
    path.write_text(json.dumps({"tools": [entry]}))
    (tool,) = load_tool_file(path)
    assert (tool.view_html, tool.answer_schema) == ("<!doctype html><p>card</p>", answer)
    start = tool.start_fields()
    assert start["view_html"] == tool.view_html
    assert dict(start["answer_schema"])["required"] == ["n"]


@pytest.mark.parametrize(
    ("entry", "suffix", "expected"),
    [
        ({"view": "../secret.txt"}, ".html", "tools[0].view: '../secret.txt' is outside"),
        ({"view": "/etc/hostname"}, ".html", "tools[0].view: '/etc/hostname' is outside"),
        ({"view": "missing.html"}, ".html", "tools[0].view: cannot read 'missing.html'"),
        ({"view": "v.html"}, ".backend", "tools[0]: only frontend tools have a view"),
        ({"answerSchema": {"type": "object"}}, ".action", "only frontend tools have a view"),
        ({"answerSchema": {"properties": {}}}, ".html", "tools[0].answerSchema.type: must be"),
    ],
)
def test_a_broken_view_or_answer_schema(
    tmp_path: Path, entry: dict[str, object], suffix: str, expected: str
) -> None:
    (tmp_path / "secret.txt").write_text("no")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "v.html").write_text("<p>")
    path = tmp_path / "tools" / f"t{suffix}"
    path.write_text(json.dumps({"tools": [{"name": "a", "description": "x", **entry}]}))
    with pytest.raises(ToolDefinitionError) as error:
        load_tool_file(path)
    assert expected in str(error.value)


def test_views_are_read_only_beside_a_file() -> None:
    entry = {"name": "a", "description": "x", "view": "v.html"}
    assert "views are read only from tool files in a directory" in error_of(
        json.dumps({"tools": [entry]}), ".html"
    )
