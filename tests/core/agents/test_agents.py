"""Agent files: schema, rules, `\"\"\"` prompts, stage resolution, shipped examples."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from service.core.agents.definition import AgentDefinition, ResolvedModel, ResolvedTools
from service.core.agents.loader import (
    SCHEMA_FILE_NAME,
    AgentDefinitionError,
    agent_json_schema,
    agent_schema_text,
    convert_multiline_prompts,
    load_agent_file,
    parse_agent_text,
)
from service.core.agents.overrides import with_overrides
from service.core.agents.registry import AgentRegistry
from service.core.errors import InvalidRequest
from service.core.model import Reasoning
from service.core.tools.names import PLAN_ADD_TASKS_TOOL, PLAN_UPDATE_TASK_TOOL

AGENTS_DIR = Path(__file__).resolve().parents[3] / "agents"


def parse(source: dict[str, Any] | str, key: str | None = "agent") -> AgentDefinition:
    text = source if isinstance(source, str) else json.dumps(source)
    return parse_agent_text(text, key=key, source=f"{key}.json")


def error_of(source: dict[str, Any] | str, key: str | None = "agent") -> str:
    with pytest.raises(AgentDefinitionError) as caught:
        parse(source, key)
    return str(caught.value)


ONESHOT: dict[str, Any] = {"mode": "ONESHOT", "plain": {"systemPrompt": "You help."}}
REACT: dict[str, Any] = {"mode": "REACT", "react": {"systemPrompt": "Think, act."}}
PLAN: dict[str, Any] = {
    "mode": "PLAN_EXECUTE",
    "planExecute": {"plan": {"systemPrompt": "Plan."}, "execute": {"systemPrompt": "Do."}},
}


# -- valid files ------------------------------------------------------------------------


def test_minimal_oneshot_takes_key_and_name_from_file_and_defaults() -> None:
    agent = parse(ONESHOT, key="helper")
    assert (agent.key, agent.name, agent.icon, agent.description) == ("helper", "helper", None, "")
    assert (agent.output, agent.tool_policy, agent.verify) == ("PLAIN", "ALLOW", "NONE")
    budget = agent.budget
    assert (budget.max_model_calls, budget.max_tool_calls, budget.max_steps) == (20, 10, 6)
    assert budget.timeout_ms == 120_000 and budget.timeout_s == 120.0
    assert agent.stage_names == ("plain",)
    stage = agent.stage("plain")
    assert stage.system_prompt == "You help."
    assert stage.model == ResolvedModel()  # default provider, its default model
    assert stage.tools == ResolvedTools() and stage.planning_tools == ()


def test_react_defaults_and_max_steps() -> None:
    assert parse(REACT).react_max_steps == 6
    agent = parse({**REACT, "react": {"systemPrompt": "x", "maxSteps": 3}})
    assert agent.react_max_steps == 3 and agent.stage_names == ("react",)


def test_plan_execute_stages_and_planning_tools() -> None:
    agent = parse(PLAN)
    assert agent.deep_thinking is False
    assert agent.stage_names == ("plan", "execute")
    assert agent.stage("plan").planning_tools == (PLAN_ADD_TASKS_TOOL,)
    assert agent.stage("execute").planning_tools == (PLAN_UPDATE_TASK_TOOL,)
    assert (PLAN_ADD_TASKS_TOOL, PLAN_UPDATE_TASK_TOOL) == (
        "_plan_add_tasks_",
        "_plan_update_task_",
    )
    with pytest.raises(LookupError, match=r"no 'planExecute\.summary' stage"):
        agent.stage("summary")

    stages = {**PLAN["planExecute"], "summary": {"systemPrompt": "Sum up."}}
    stages["plan"] = {"systemPrompt": "Plan.", "deepThinking": True}
    agent = parse({**PLAN, "planExecute": stages})
    assert agent.deep_thinking is True
    assert agent.stage_names == ("plan", "execute", "summary")
    assert agent.stage("summary").planning_tools == ()


def test_plan_execute_parallel_replan_and_verify_options() -> None:
    agent = parse(PLAN)
    assert (agent.plan_max_tasks, agent.plan_parallel, agent.task_max_rounds) == (10, 1, 10)
    assert (agent.replan_only_after_failure, agent.verify_max_rounds) == (False, 1)
    stages = {
        "plan": {"systemPrompt": "Plan.", "maxTasks": 4},
        "execute": {"systemPrompt": "Do.", "parallel": 3, "maxRounds": 2},
        "replan": {"systemPrompt": "Review.", "onlyAfterFailure": True},
        "verify": {"systemPrompt": "Check.", "maxRounds": 2, "modelConfig": {"model": "judge"}},
    }
    agent = parse({**PLAN, "toolConfig": {"backends": ["echo"]}, "planExecute": stages})
    assert (agent.plan_max_tasks, agent.plan_parallel, agent.task_max_rounds) == (4, 3, 2)
    assert (agent.replan_only_after_failure, agent.verify_max_rounds) == (True, 2)
    assert agent.stage_names == ("plan", "execute", "replan", "verify")
    replan, verify = agent.stage("replan"), agent.stage("verify")
    assert (replan.planning_tools, verify.planning_tools) == (
        ("_plan_decide_",),
        ("_plan_verify_",),
    )
    assert replan.tools == verify.tools == ResolvedTools()  # only their fixed tool
    assert agent.stage("execute").tools == ResolvedTools(backends=("echo",))
    assert (replan.system_prompt, verify.model.model) == ("Review.", "judge")
    assert agent.tool_names() == ["echo"]


def test_plan_execute_option_errors_name_the_field() -> None:
    stages = {
        "plan": {"systemPrompt": "Plan.", "maxTasks": 0},
        "execute": {"systemPrompt": "Do.", "parallel": 17},
        "replan": {"systemPrompt": " ", "toolConfig": None},
        "verify": {"systemPrompt": "Check.", "maxRounds": 0},
    }
    assert error_of({**PLAN, "planExecute": stages}) == (
        "agent.json: planExecute.plan.maxTasks: Input should be greater than 0 (got 0); "
        "planExecute.execute.parallel: Input should be less than or equal to 16 (got 17); "
        "planExecute.replan.systemPrompt: must not be empty; "
        "planExecute.replan.toolConfig: unknown key (did you mean 'modelConfig'?); "
        "planExecute.verify.maxRounds: Input should be greater than 0 (got 0)"
    )
    named = {**ONESHOT, "toolConfig": {"backends": ["_plan_decide_", "_plan_verify_"]}}
    assert error_of(named) == (
        "agent.json: toolConfig.backends[0]: '_plan_decide_' is a planning tool the runner adds "
        "itself; toolConfig.backends[1]: '_plan_verify_' is a planning tool the runner adds itself"
    )


def test_full_spec_example_with_policy_overrides() -> None:
    agent = parse(
        {
            "$schema": "./agent.schema.json",
            "key": "agent",
            "name": "Agent",
            "icon": "emoji:🤖",
            "description": "d",
            "modelConfig": {
                "providerKey": "bailian",
                "model": "qwen3-max",
                "reasoning": {"enabled": True, "effort": "HIGH"},
                "temperature": 0.7,
                "top_p": 0.95,
                "max_tokens": 4096,
            },
            "toolConfig": {
                "backends": ["_bash_", "city_datetime"],
                "frontends": ["show_weather_card"],
                "actions": ["switch_theme"],
            },
            "mode": "ONESHOT",
            "output": "REASONING_SUMMARY",
            "toolPolicy": "REQUIRE",
            "verify": "SECOND_PASS_FIX",
            "budget": {"maxModelCalls": 3, "maxToolCalls": 2, "maxSteps": 1, "timeoutMs": 500},
            "plain": {"systemPrompt": "..."},
        }
    )
    assert (agent.output, agent.tool_policy, agent.verify) == (
        "REASONING_SUMMARY",
        "REQUIRE",
        "SECOND_PASS_FIX",
    )
    assert agent.budget.max_model_calls == 3 and agent.budget.timeout_s == 0.5
    stage = agent.stage("plain")
    assert stage.model == ResolvedModel(
        "bailian", "qwen3-max", Reasoning(True, "HIGH"), 0.7, 0.95, 4096
    )
    assert stage.tools.names == ("_bash_", "city_datetime", "show_weather_card", "switch_theme")
    assert agent.tool_names() == list(stage.tools.names)
    again = parse(json.dumps(agent.to_json_dict()))
    assert again.to_json_dict() == agent.to_json_dict() and again.stage("plain") == stage
    assert again.json_schema_ref is None  # to_json_dict() leaves `$schema` out


def test_examples_are_a_short_list_of_prompts() -> None:
    assert parse(ONESHOT).examples == []
    agent = parse({**ONESHOT, "examples": ["What's the weather in Lyon?", "Hello"]})
    assert agent.examples == ["What's the weather in Lyon?", "Hello"]
    assert error_of({**ONESHOT, "examples": ["fine", ""]}) == (
        'agent.json: examples[1]: String should have at least 1 character (got "")'
    )
    assert "examples: List should have at most 10 items" in error_of(
        {**ONESHOT, "examples": ["x"] * 11}
    )


def test_definitions_are_immutable() -> None:
    agent = parse(ONESHOT)
    with pytest.raises(ValueError, match="frozen"):
        agent.mode = "REACT"  # type: ignore[misc]


def test_a_copy_in_another_mode_or_with_overrides_has_its_own_json() -> None:
    agent = parse(
        {
            **REACT,
            "modes": ["REACT", "ONESHOT"],
            "plain": {"systemPrompt": "Help."},
            "overrides": ["budget.maxModelCalls"],
        }
    )
    assert json.loads(agent.json_bytes) == agent.to_json_dict()  # made once, then kept
    oneshot = agent.in_mode("ONESHOT")
    assert json.loads(oneshot.json_bytes)["mode"] == "ONESHOT"
    assert json.loads(agent.json_bytes)["mode"] == "REACT"
    limited = with_overrides(agent, {"budget.maxModelCalls": 2})
    assert json.loads(limited.json_bytes)["budget"]["maxModelCalls"] == 2


# -- rules: each violation names the field and says why ---------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ({"mode": "ONESHOT"}, "plain: is required by mode ONESHOT (with a systemPrompt)"),
        ({**ONESHOT, "mode": "REACT"}, "react: is required by mode REACT (with a systemPrompt)"),
        (
            {"mode": "PLAN_EXECUTE"},
            "planExecute.plan: is required by mode PLAN_EXECUTE (with a systemPrompt); "
            "planExecute.execute: is required by mode PLAN_EXECUTE (with a systemPrompt)",
        ),
        (
            {"mode": "PLAN_EXECUTE", "planExecute": {"plan": {"systemPrompt": "p"}}},
            "planExecute.execute: is required by mode PLAN_EXECUTE (with a systemPrompt)",
        ),
        ({"mode": "ONESHOT", "plain": {}}, "plain.systemPrompt: is required"),
        (
            {"mode": "ONESHOT", "plain": {"systemPrompt": ""}},
            "plain.systemPrompt: must not be empty",
        ),
        (
            {**PLAN, "planExecute": {**PLAN["planExecute"], "summary": {"systemPrompt": " \n"}}},
            "planExecute.summary.systemPrompt: must not be empty",
        ),
        ({"plain": {"systemPrompt": "x"}}, "mode: is required"),
        (
            {**ONESHOT, "mode": "oneshot"},
            "mode: Input should be 'ONESHOT', 'REACT' or 'PLAN_EXECUTE' (got \"oneshot\")",
        ),
        (
            {**ONESHOT, "output": "SUMMARY"},
            "output: Input should be 'PLAIN' or 'REASONING_SUMMARY' (got \"SUMMARY\")",
        ),
        (
            {**ONESHOT, "toolPolicy": "NEVER"},
            "toolPolicy: Input should be 'DISALLOW', 'ALLOW' or 'REQUIRE' (got \"NEVER\")",
        ),
        (
            {**ONESHOT, "verify": "TWICE"},
            "verify: Input should be 'NONE' or 'SECOND_PASS_FIX' (got \"TWICE\")",
        ),
        (
            {**ONESHOT, "modelConfig": {"reasoning": {"effort": "low"}}},
            "modelConfig.reasoning.effort: Input should be 'LOW', 'MEDIUM' or 'HIGH' (got \"low\")",
        ),
        (
            {**ONESHOT, "modelConfig": {"reasoning": {"enabled": "yes"}}},
            'modelConfig.reasoning.enabled: Input should be a valid boolean (got "yes")',
        ),
        (
            {**ONESHOT, "modelConfig": {"temperature": 3}},
            "modelConfig.temperature: Input should be less than or equal to 2 (got 3)",
        ),
        (
            {**ONESHOT, "budget": {"maxSteps": 0}},
            "budget.maxSteps: Input should be greater than 0 (got 0)",
        ),
        (
            {**ONESHOT, "budget": {"timeoutMs": -1}},
            "budget.timeoutMs: Input should be greater than 0 (got -1)",
        ),
        (
            {"mode": "REACT", "react": {"systemPrompt": "x", "maxSteps": 0}},
            "react.maxSteps: Input should be greater than 0 (got 0)",
        ),
        (
            {**ONESHOT, "key": "other"},
            "key: 'other' must equal the file name 'agent' (or be omitted)",
        ),
        (
            {**ONESHOT, "toolConfig": {"backends": ["a", "b", "a"]}},
            "toolConfig.backends[2]: duplicate tool name 'a' (see backends[0])",
        ),
        (
            {**ONESHOT, "toolConfig": {"backends": ["a"], "actions": ["a"]}},
            "toolConfig.actions[0]: duplicate tool name 'a' (see backends[0])",
        ),
        (
            {
                "mode": "ONESHOT",
                "plain": {"systemPrompt": "x", "toolConfig": {"frontends": ["f", "f"]}},
            },
            "plain.toolConfig.frontends[1]: duplicate tool name 'f' (see frontends[0])",
        ),
        (
            {**PLAN, "toolConfig": {"backends": [PLAN_ADD_TASKS_TOOL]}},
            "toolConfig.backends[0]: '_plan_add_tasks_' is a planning tool the runner adds itself",
        ),
        (
            {**ONESHOT, "toolConfig": {"backends": ["has space"]}},
            "toolConfig.backends[0]: String should match pattern '^[A-Za-z0-9_-]{1,64}$' "
            '(got "has space")',
        ),
        (
            {"mode": "ONESHOT", "plain": {"sytemPrompt": "x"}},
            "plain.systemPrompt: is required; "
            "plain.sytemPrompt: unknown key (did you mean 'systemPrompt'?)",
        ),
        ({**ONESHOT, "modelconfig": {}}, "modelconfig: unknown key (did you mean 'modelConfig'?)"),
        (
            {**ONESHOT, "modelConfig": {"provider": "x"}},
            "modelConfig.provider: unknown key (did you mean 'providerKey'?)",
        ),
        ({**ONESHOT, "colour": "red"}, "colour: unknown key"),
        ("[1, 2]", "the file must hold one JSON object"),
        ('{"mode": "ONESHOT", "mode": "REACT"}', "mode: duplicate key in one object"),
    ],
)
def test_each_rule_names_the_field_and_why(source: dict[str, Any] | str, expected: str) -> None:
    assert error_of(source) == f"agent.json: {expected}"


def test_key_is_required_without_a_file_name() -> None:
    assert parse({**ONESHOT, "key": "k"}, key=None).key == "k"
    with pytest.raises(AgentDefinitionError) as caught:
        parse_agent_text(json.dumps(ONESHOT), key=None)
    assert str(caught.value) == "key: is required"


def test_error_carries_structured_issues() -> None:
    with pytest.raises(AgentDefinitionError) as caught:
        parse({"mode": "ONESHOT", "plain": {"systemPrompt": ""}, "output": "X"})
    error = caught.value
    assert isinstance(error, InvalidRequest)
    assert error.source == "agent.json" and error.metadata == {"file": "agent.json"}
    assert [issue.path for issue in error.issues] == ["output", "plain.systemPrompt"]


# -- \"\"\" multi-line prompts ---------------------------------------------------------


def test_multiline_prompt_is_verbatim_with_quotes_backslashes_and_tabs() -> None:
    text = (
        '{"mode": "ONESHOT", "plain": {"systemPrompt": """\n'
        'Say "hi" to C:\\temp\\new and \\n stays two characters.\n'
        '\tIndented with a tab; {"json": "inside"}\n'
        '"""}}'
    )
    assert parse(text).stage("plain").system_prompt == (
        'Say "hi" to C:\\temp\\new and \\n stays two characters.\n'
        '\tIndented with a tab; {"json": "inside"}'
    )


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("one line", "one line"),
        ("\nfirst\nsecond\n", "first\nsecond"),
        ("first\nsecond", "first\nsecond"),
        ("   \n  indented\n      ", "  indented"),  # closing quotes indented
        ("\n\nblank line first\n\n", "\nblank line first\n"),  # only one break each side
        ("\r\nwindows\r\nlines\r\n", "windows\nlines"),
        ('say "hi"', 'say "hi"'),  # quotes after the closing """ belong to the text
    ],
)
def test_multiline_trimming_convention(body: str, expected: str) -> None:
    converted, _ = convert_multiline_prompts('{"systemPrompt": """' + body + '"""}')
    assert json.loads(converted) == {"systemPrompt": expected}


def test_multiline_allowed_for_any_key_ending_in_systemprompt_case_insensitively() -> None:
    text = '{"a": "x", "planSYSTEMPROMPT": """p""", "b": ["\\"\\"\\"", 1], "systemprompt":"""q"""}'
    converted, _ = convert_multiline_prompts(text)
    assert json.loads(converted) == {
        "a": "x",
        "planSYSTEMPROMPT": "p",
        "b": ['"""', 1],
        "systemprompt": "q",
    }


def test_multiline_for_another_key_is_refused_naming_the_key_and_position() -> None:
    text = '{\n  "mode": "ONESHOT",\n  "description": """\nhello\n""",\n  "plain": {}\n}'
    assert error_of(text) == (
        "agent.json: description (at line 3, column 18): "
        '""" text is not allowed for key \'description\': only for keys ending in systemPrompt'
    )


def test_multiline_outside_a_value_is_refused() -> None:
    assert error_of('{"mode": "ONESHOT", "list": ["""x"""]}') == (
        "agent.json: line 1, column 30: "
        '""" text is not allowed outside a key\'s value: only for keys ending in systemPrompt'
    )


def test_unterminated_multiline_is_reported_at_its_start() -> None:
    text = '{"mode": "ONESHOT",\n "plain": {"systemPrompt": """\nno end\n}}'
    assert (
        error_of(text) == 'agent.json: systemPrompt (at line 2, column 28): unterminated """ text'
    )


def test_json_errors_report_positions_in_the_original_file() -> None:
    text = (
        "{\n"
        '  "mode": "ONESHOT",\n'
        '  "plain": {"systemPrompt": """\n'
        "line one\n"
        'line "two"\n'
        '"""},\n'
        '  "output": "PLAIN"\n'
        '  "verify": "NONE"\n'
        "}\n"
    )
    assert error_of(text) == "agent.json: line 8, column 3: invalid JSON: Expecting ',' delimiter"
    assert error_of('{"mode": "ONESHOT",, }') == (
        "agent.json: line 1, column 20: "
        "invalid JSON: Expecting property name enclosed in double quotes"
    )


def test_json_error_right_after_a_multiline_prompt_points_at_it() -> None:
    text = '{"plain": {"systemPrompt": """x""" "y"}}'
    assert error_of(text) == "agent.json: line 1, column 36: invalid JSON: Expecting ',' delimiter"


# -- inheritance ------------------------------------------------------------------------


def test_stage_model_config_overrides_outer_field_by_field() -> None:
    agent = parse(
        {
            "mode": "PLAN_EXECUTE",
            "modelConfig": {
                "providerKey": "outer",
                "model": "big",
                "reasoning": {"enabled": True, "effort": "HIGH"},
                "temperature": 0.2,
                "max_tokens": 100,
            },
            "planExecute": {
                "plan": {
                    "systemPrompt": "p",
                    "modelConfig": {"model": "small", "reasoning": {"effort": "LOW"}, "top_p": 0.5},
                },
                "execute": {
                    "systemPrompt": "e",
                    "modelConfig": {"temperature": None, "reasoning": {"enabled": False}},
                },
                "summary": {"systemPrompt": "s", "modelConfig": {"reasoning": None}},
            },
        }
    )
    assert agent.stage("plan").model == ResolvedModel(
        "outer", "small", Reasoning(True, "LOW"), 0.2, 0.5, 100
    )
    assert agent.stage("execute").model == ResolvedModel(
        "outer", "big", Reasoning(False, "HIGH"), None, None, 100
    )
    assert agent.stage("summary").model == ResolvedModel(
        "outer", "big", Reasoning(), 0.2, None, 100
    )


def test_stage_model_config_without_outer() -> None:
    agent = parse(
        {"mode": "ONESHOT", "plain": {"systemPrompt": "x", "modelConfig": {"model": "m"}}}
    )
    assert agent.stage("plain").model == ResolvedModel(model="m")


OUTER_TOOLS = {"backends": ["city_datetime"], "frontends": ["card"], "actions": ["theme"]}


@pytest.mark.parametrize(
    ("outer", "stage", "expected"),
    [
        (None, {}, ResolvedTools()),
        (OUTER_TOOLS, {}, ResolvedTools(("city_datetime",), ("card",), ("theme",))),
        (OUTER_TOOLS, {"toolConfig": None}, ResolvedTools()),
        (OUTER_TOOLS, {"toolConfig": {"backends": ["_bash_"]}}, ResolvedTools(("_bash_",))),
        (None, {"toolConfig": {"actions": ["theme"]}}, ResolvedTools(actions=("theme",))),
        (None, {"toolConfig": None}, ResolvedTools()),
    ],
)
def test_tool_config_absent_null_or_set(
    outer: dict[str, Any] | None, stage: dict[str, Any], expected: ResolvedTools
) -> None:
    source: dict[str, Any] = {"mode": "REACT", "react": {"systemPrompt": "x", **stage}}
    if outer is not None:
        source["toolConfig"] = outer
    assert parse(source).stage("react").tools == expected


def test_planning_tools_stay_whatever_tool_config_says() -> None:
    stages = {
        "plan": {"systemPrompt": "p", "toolConfig": None},
        "execute": {"systemPrompt": "e", "toolConfig": {"backends": ["x"]}},
    }
    agent = parse({**PLAN, "toolConfig": {"backends": ["y"]}, "planExecute": stages})
    plan, execute = agent.stage("plan"), agent.stage("execute")
    assert (plan.tools, plan.planning_tools) == (ResolvedTools(), (PLAN_ADD_TASKS_TOOL,))
    assert (execute.tools.names, execute.planning_tools) == (("x",), (PLAN_UPDATE_TASK_TOOL,))
    assert agent.tool_names() == ["x"]


def test_explicit_null_tool_config_survives_a_round_trip() -> None:
    agent = parse(
        {**REACT, "toolConfig": OUTER_TOOLS, "react": {"systemPrompt": "x", "toolConfig": None}}
    )
    again = parse(json.dumps(agent.to_json_dict()))
    assert again.stage("react").tools == ResolvedTools()
    assert "$schema" not in parse({**ONESHOT, "$schema": "./agent.schema.json"}).to_json_dict()


# -- shipped examples and the schema file ----------------------------------------------


def test_shipped_examples_all_load() -> None:
    registry = AgentRegistry(AGENTS_DIR)
    registry.load_all()
    assert registry.errors == {}
    agents = {agent.key: agent for agent in registry.list()}
    assert sorted(agents) == [
        "demo_action",
        "demo_concierge",
        "demo_context",
        "demo_copilot",
        "demo_escalate",
        "demo_frontend",
        "demo_loop",
        "demo_mcp",
        "demo_oneshot",
        "demo_parallel",
        "demo_plain",
        "demo_plan",
        "demo_question",
        "demo_react",
        "demo_replan",
        "demo_researcher",
        "demo_shell",
        "demo_skills",
        "demo_team",
        "demo_verify",
    ]
    for agent in agents.values():
        assert agent.json_schema_ref == f"./{SCHEMA_FILE_NAME}"
        assert agent.name and agent.description and (agent.icon or "").startswith("emoji:")
        assert agent.examples, f"{agent.key} offers no example prompts"
        for name in agent.stage_names:  # the default provider and its default model
            assert agent.stage(name).model.provider_key is None
            assert agent.stage(name).model.model is None

    assert '"""' in (AGENTS_DIR / "demo_oneshot.json").read_text(encoding="utf-8")
    assert agents["demo_oneshot"].stage("plain").model.reasoning.enabled is True
    assert agents["demo_plain"].stage("plain").model.reasoning.enabled is False
    react = agents["demo_react"]
    assert (react.mode, react.react_max_steps) == ("REACT", 5)
    assert react.stage("react").tools.backends == ("city_datetime", "mock_city_weather")
    plan = agents["demo_plan"]
    assert (plan.mode, plan.deep_thinking) == ("PLAN_EXECUTE", True)
    assert plan.stage_names == ("plan", "execute", "summary")
    assert plan.stage("execute").tools.backends == ("city_datetime", "mock_city_weather")


def test_load_agent_file_uses_the_file_name(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(ONESHOT), encoding="utf-8")
    assert load_agent_file(path).key == "mine"
    path.write_bytes(b'{"mode": "\xff"}')
    with pytest.raises(AgentDefinitionError, match=r"^mine\.json: not UTF-8 text"):
        load_agent_file(path)


def test_schema_file_is_up_to_date() -> None:
    """Regenerate with: python -m service.core.agents.loader agents/agent.schema.json"""
    assert (AGENTS_DIR / SCHEMA_FILE_NAME).read_text(encoding="utf-8") == agent_schema_text()


def test_schema_describes_the_file_by_alias() -> None:
    schema = agent_json_schema()
    assert schema["required"] == ["mode"]
    assert schema["additionalProperties"] is False
    assert {"$schema", "modelConfig", "toolConfig", "toolPolicy", "planExecute"} <= set(
        schema["properties"]
    )
    model = schema["$defs"]["ModelConfig"]["properties"]
    assert {
        "providerKey",
        "model",
        "reasoning",
        "temperature",
        "top_p",
        "max_tokens",
        "contextLength",
        "extraBody",
    } == set(model)
    assert set(schema["$defs"]["Budget"]["properties"]) == {
        "maxModelCalls",
        "maxToolCalls",
        "maxSteps",
        "timeoutMs",
    }
    assert schema["$defs"]["PlanStage"]["properties"]["deepThinking"]["default"] is False
