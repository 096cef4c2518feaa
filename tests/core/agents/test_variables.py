"""The prompt variables' check when an agent file loads (service/core/agents/variables.py)."""

from __future__ import annotations

from service.core.agents.variables import prompt_issues


def test_known_variables_escaped_braces_and_plain_text_pass() -> None:
    text = "On {{ date }} ({{now-1d}}), {{user}}: {{params}} {{params.a.b}} {{scene.x+2d}} \\{{x}}"
    assert prompt_issues(text) == []
    assert prompt_issues("no variables { } }} here") == []


def test_each_wrong_variable_is_named() -> None:
    assert prompt_issues("{{ city }} {{now.x}} {{ unclosed") == [
        "unknown prompt variable '{{ city }}' (the variables are date, now, user, params, "
        "scene; write \\{{ for literal braces)",
        "'{{now.x}}': now has no fields",
        "'{{ unclosed' starts no prompt variable (they are date, now, user, params, scene, "
        "e.g. {{date}}, {{params.city}}); write \\{{ for literal braces",
    ]
