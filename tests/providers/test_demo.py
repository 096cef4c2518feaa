"""The demo model decides from the request's structure and the agent's script, not prompt text."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from service.core.tools.planning import PLANNING_DEFINITIONS
from service.providers import loopback as lb
from service.providers.demo import demo_responder
from service.providers.demo_tools import (
    DEMO_LINE,
    GENERAL_TASKS,
    Answer,
    Call,
    Places,
    Script,
    ScriptError,
    Task,
    ToolUse,
    cities_named,
    decide,
    demo_text,
)

ROOT = Path(__file__).resolve().parents[2]
DEMO_MODULES = sorted((ROOT / "service" / "providers").glob("demo*.py"))
#: What the demo may take from the core: the names of the planning tools it is offered.
ALLOWED_CORE_IMPORTS = {
    ("service.core.tools.names", "PLAN_ADD_TASKS_TOOL"),
    ("service.core.tools.names", "PLAN_UPDATE_TASK_TOOL"),
    ("service.core.tools.names", "PLAN_DECIDE_TOOL"),
    ("service.core.tools.names", "PLAN_VERIFY_TOOL"),
    ("service.core.tools.names", "CONTEXT_SUMMARY_TOOL"),
}
#: The core modules that write what the model reads: prompts, briefs, instructions, results.
CORE = ROOT / "service" / "core"
PROMPT_MODULES = [
    *sorted((CORE / "modes").rglob("*.py")),
    *(CORE / "run" / f"{name}.py" for name in ("passes", "loop", "executor", "permissions")),
    *(CORE / "run" / f"{name}.py" for name in ("subagents", "window")),
    *(CORE / "tools" / f"{name}.py" for name in ("planning", "registry", "guards")),
    CORE / "agents" / "skills.py",
    CORE / "tools" / "skill_tool.py",
]


def _texts(path: Path) -> list[str]:
    """The string literals of a module (f-string pieces included), docstrings left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
    ]


def test_the_demo_imports_nothing_of_the_core_but_the_planning_tool_names() -> None:
    assert [p.name for p in DEMO_MODULES] == ["demo.py", "demo_tools.py"]
    for path in DEMO_MODULES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                assert not [a.name for a in node.names if a.name.startswith("service.core")]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "service.core"
            ):
                names = {(node.module, alias.name) for alias in node.names}
                assert names <= ALLOWED_CORE_IMPORTS, f"{path.name} imports {names}"


def _vocabulary(schema: Any) -> set[str]:
    """The property names and enum values of a JSON Schema, at every depth."""
    found: set[str] = set()
    if isinstance(schema, dict):
        found |= set(schema.get("properties") or {})
        found |= {v for v in schema.get("enum") or [] if isinstance(v, str)}
        for value in schema.values():
            found |= _vocabulary(value)
    elif isinstance(schema, list):
        for value in schema:
            found |= _vocabulary(value)
    return found


#: The planning tools' argument names and values: structure both sides speak, not prompt text.
VOCABULARY = {word for d in PLANNING_DEFINITIONS.values() for word in _vocabulary(d.parameters)}


def test_the_demo_matches_no_prompt_text_of_the_core() -> None:
    """No literal of the demo is (part of) a text the core sends the model, or contains one."""
    core = [
        " ".join(text.split())
        for path in PROMPT_MODULES
        for text in _texts(path)
        if len(text.strip()) >= 12 and text not in VOCABULARY
    ]
    demo = [
        " ".join(text.split())
        for path in DEMO_MODULES
        for text in _texts(path)
        if len(text.strip()) >= 12 and text not in VOCABULARY
    ]
    assert demo and len(core) > 20
    assert all(word.isidentifier() for word in VOCABULARY)  # names, never sentences
    shared = [(d, c) for d in demo for c in core if d in c or c in d]
    assert shared == []


# -- decisions ---------------------------------------------------------------------------


def fn(name: str, **properties: Any) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties}
    return {"type": "function", "function": {"name": name, "parameters": schema}}


CITY = fn("city_datetime", city={"type": "string"})
WEATHER = fn("mock_city_weather", city={"type": "string"}, date={"type": "string"})
PLAN = fn("_plan_add_tasks_", tasks={"type": "array"})
REPORT = fn("_plan_update_task_", taskId={"type": "string"}, status={"type": "string"})
DECIDE = fn("_plan_decide_", decision={"type": "string"})
VERIFY = fn("_plan_verify_", verdict={"type": "string"})


def body(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": "Be nice."}, *messages], **fields}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def called(name: str, result: Any) -> list[dict[str, Any]]:
    """An assistant turn calling `name`, and its result."""
    call = {"id": "c", "type": "function", "function": {"name": name, "arguments": "{}"}}
    content = json.dumps(result)
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "name": name, "content": content},
    ]


SCRIPT = Script.parse(
    {
        "calls": [
            {"tool": "mock_city_weather", "arguments": {"date": "2030-01-02"}},
            {"tool": "city_datetime"},
        ]
    }
)


def test_without_tools_or_script_the_demo_echoes() -> None:
    assert decide(body(user("Hello")), Script()) is None
    assert decide(body(user("Hi"), tools=[CITY], tool_choice="none"), Script()) is None


def test_scripted_calls_are_made_one_per_turn_in_order_then_summed_up() -> None:
    tools = {"tools": [CITY, WEATHER]}
    first = body(user("Rain in Paris?"), **tools)
    assert decide(first, SCRIPT) == Call(
        "mock_city_weather", {"city": "Paris", "date": "2030-01-02"}
    )
    weather = {"city": "Paris", "condition": "rain"}
    second = body(user("Rain in Paris?"), *called("mock_city_weather", weather), **tools)
    assert decide(second, SCRIPT) == Call("city_datetime", {"city": "Paris"})
    third = body(
        user("Rain in Paris?"),
        *called("mock_city_weather", weather),
        *called("city_datetime", {"time": "12:00"}),
        **tools,
    )
    assert decide(third, SCRIPT) == Answer(
        f"{DEMO_LINE}\n\nHere is what the tools found:\n"
        "- **mock_city_weather**: city: Paris, condition: rain\n"
        "- **city_datetime**: time: 12:00",
        "I have 2 tool result(s) to sum up.",
    )
    answered = Script(SCRIPT.calls, answer="It rains.")
    assert decide(third, answered) == Answer(
        demo_text("It rains."), "I have 2 tool result(s) to sum up."
    )


def test_without_a_script_each_offered_tool_is_called_once_in_order() -> None:
    tools = {"tools": [CITY, WEATHER]}
    assert decide(body(user("Time in Tokyo"), **tools), Script()) == Call(
        "city_datetime", {"city": "Tokyo"}
    )
    after = body(user("Weather tomorrow in Tokyo"), *called("city_datetime", {}), **tools)
    assert decide(after, Script()) == Call(
        "mock_city_weather", {"city": "Tokyo", "date": "{{city_datetime.date+1d}}"}
    )


def test_tool_choice_decides_first() -> None:
    messages = (user("Hi"),)
    forced = {"type": "function", "function": {"name": "city_datetime"}}
    assert decide(body(*messages, tools=[WEATHER, CITY], tool_choice=forced), SCRIPT) == Call(
        "city_datetime", {"city": "Shanghai"}
    )
    assert decide(body(*messages, tools=[CITY], tool_choice="none"), SCRIPT) is None
    done = body(*messages, *called("city_datetime", {}), tools=[CITY], tool_choice="required")
    assert decide(done, Script(())) == Call("city_datetime", {"city": "Shanghai"})
    assert decide({**done, "tool_choice": "auto"}, Script((), answer="Noon.")) == Answer(
        demo_text("Noon."), "I have 1 tool result(s) to sum up."
    )


PLAN_SCRIPT = Script(
    plan=(
        Task("Find the time", (ToolUse("city_datetime"),)),
        Task("Find the weather", (ToolUse("mock_city_weather", {"date": "today"}),)),
    )
)


def test_the_plan_stage_drafts_then_records_the_scripted_tasks() -> None:
    draft = body(user("Paris"), tools=[PLAN], tool_choice="none")
    assert decide(draft, PLAN_SCRIPT) == Answer(
        demo_text("My plan:\n1. Find the time\n2. Find the weather"), "Let me plan the steps."
    )
    record = body(user("Paris"), tools=[PLAN], tool_choice="required")
    assert decide(record, PLAN_SCRIPT) == Call(
        "_plan_add_tasks_",
        {"tasks": [{"description": "Find the time"}, {"description": "Find the weather"}]},
    )
    general = [{"description": d} for d in GENERAL_TASKS]
    assert decide(record, Script()) == Call("_plan_add_tasks_", {"tasks": general})


def test_a_task_makes_the_calls_of_the_task_named_last_then_reports() -> None:
    brief = user("Plan: Find the time; Find the weather.\nNow: Find the weather in Paris")
    tools = {"tools": [CITY, WEATHER, REPORT]}
    assert decide(body(brief, **tools), PLAN_SCRIPT) == Call(
        "mock_city_weather", {"city": "Paris", "date": "today"}
    )
    weather = {"condition": "sunny"}
    done = body(brief, *called("mock_city_weather", weather), **tools)
    assert decide(done, PLAN_SCRIPT) == Call(
        "_plan_update_task_", {"status": "completed", "result": "condition: sunny"}
    )
    forced = {"type": "function", "function": {"name": "_plan_update_task_"}}
    assert decide(body(user("Report it."), tool_choice=forced, **tools), PLAN_SCRIPT) == Call(
        "_plan_update_task_", {"status": "completed", "result": "done"}
    )
    assert decide(body(user("Something else"), **tools), Script()) == Call(
        "city_datetime", {"city": "Shanghai"}
    )


ROUNDS = Script.parse(
    {
        "plan": [
            {"task": "Find a", "expectedOutput": "a", "requiredTools": ["city_datetime"]},
            {"task": "Use a", "dependsOn": [1]},
        ],
        "replan": [
            {"decision": "revise", "reason": "Try b.", "plan": [{"task": "Find b"}]},
            {"decision": "finish"},
        ],
        "verify": [
            {"verdict": "needsMorePlanning", "improvements": ["c"], "plan": [{"task": "Find c"}]},
            {"verdict": "pass", "reason": "All there."},
        ],
    }
)


def test_the_planner_records_the_round_of_its_earlier_calls() -> None:
    record = body(user("Go"), tools=[PLAN], tool_choice="required")
    assert decide(record, ROUNDS) == Call(
        "_plan_add_tasks_",
        {
            "tasks": [
                {
                    "description": "Find a",
                    "expectedOutput": "a",
                    "requiredTools": ["city_datetime"],
                },
                {"description": "Use a", "dependsOn": [1]},
            ]
        },
    )
    again = body(
        user("Go"), *called("_plan_add_tasks_", {}), user("More"), tools=[PLAN], tool_choice="none"
    )
    assert decide(again, ROUNDS) == Answer(
        demo_text("My plan:\n1. Find c"), "Let me plan the steps."
    )
    later = {**again, "tool_choice": "required"}
    assert decide(later, ROUNDS) == Call("_plan_add_tasks_", {"tasks": [{"description": "Find c"}]})


def test_the_replanner_and_the_verifier_play_their_script_in_order() -> None:
    first = body(user("Plan so far"), tools=[DECIDE], tool_choice="required")
    assert decide(first, ROUNDS) == Call(
        "_plan_decide_",
        {"decision": "revise", "reason": "Try b.", "tasks": [{"description": "Find b"}]},
    )
    second = body(user("Plan"), *called("_plan_decide_", {}), user("Now"), tools=[DECIDE])
    assert decide(second, ROUNDS) == Call(
        "_plan_decide_", {"decision": "finish", "reason": "All that was asked is known now."}
    )
    third = {**second, "messages": second["messages"] + called("_plan_decide_", {})}
    assert decide(third, ROUNDS) == Call(
        "_plan_decide_", {"decision": "continue", "reason": "The remaining steps still fit."}
    )
    check = body(user("Results"), tools=[VERIFY], tool_choice="required")
    assert decide(check, ROUNDS) == Call(
        "_plan_verify_", {"verdict": "needsMorePlanning", "improvements": ["c"]}
    )
    recheck = body(user("Results"), *called("_plan_verify_", {}), user("Again"), tools=[VERIFY])
    assert decide(recheck, ROUNDS) == Call(
        "_plan_verify_", {"verdict": "pass", "reason": "All there."}
    )
    assert decide(recheck, Script()) == Call("_plan_verify_", {"verdict": "pass"})


def test_a_task_of_a_later_round_makes_its_calls_too() -> None:
    script = Script.parse(
        {
            "plan": [{"task": "Find a"}],
            "verify": [
                {
                    "verdict": "needsMorePlanning",
                    "improvements": ["b"],
                    "plan": [{"task": "Find the time", "calls": [{"tool": "city_datetime"}]}],
                }
            ],
        }
    )
    brief = user("Plan: Find a; Find the time.\nNow: Find the time in Paris")
    assert decide(body(brief, tools=[CITY, REPORT]), script) == Call(
        "city_datetime", {"city": "Paris"}
    )


# -- the cities the user names -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "cities"),
    [
        ("What's the weather in Lyon?", ("Lyon",)),
        ("weather in lyon and são paulo", ("Lyon", "São Paulo")),  # known ones in any case
        ("Compare Lyon and Oslo right now", ("Lyon", "Oslo")),  # in the order named
        ("Weather in New York tomorrow?", ("New York",)),
        ("Compare Springfield and Atlantis", ("Springfield", "Atlantis")),  # unknown, capitalised
        ("Research Barcelona: local time", ("Barcelona",)),  # a sentence's first word is not
        ("Will it rain in Lyon on May 1st?", ("Lyon",)),  # months, days and seasons are not
        ("Help me plan a trip in spring", ()),
        ("上海的天气", ("上海",)),
        ("rome or chromed", ("Rome",)),  # not inside a word
    ],
)
def test_the_cities_a_message_names(text: str, cities: tuple[str, ...]) -> None:
    assert cities_named(text) == cities


def test_the_latest_message_naming_a_city_gives_the_places() -> None:
    messages = [user("Weather in Lyon?"), {"role": "assistant", "content": "Sunny."}]
    assert Places.named_in([*messages, user("And tomorrow?")]).named == ("Lyon",)
    assert Places.named_in([*messages, user("And in Oslo?")]).named == ("Oslo",)
    assert Places.named_in([user("Hello")]).named == ()
    defaults = Places()
    assert (defaults.city(), defaults.city(1)) == ("Shanghai", "Paris")
    assert Places(("Paris",)).city(1) == "Shanghai"  # a default not named already
    assert Places(("Lyon",)).fill("{city} ({zone}) vs {city2}") == "Lyon (Europe/Paris) vs Shanghai"
    assert Places(("Atlantis",)).fill("{zone}") == "UTC"


CITY_SCRIPT = Script.parse(
    {
        "plan": [
            {"task": "Time in {city}", "calls": [{"tool": "city_datetime"}]},
            {
                "task": "Time in {city2}",
                "calls": [{"tool": "city_datetime", "arguments": {"city": "{city2}"}}],
            },
        ],
        "answer": "Compared {city} and {city2}.",
    }
)


def test_the_script_speaks_of_the_cities_the_user_named() -> None:
    record = body(user("Compare Lyon and Oslo"), tools=[PLAN], tool_choice="required")
    assert decide(record, CITY_SCRIPT) == Call(
        "_plan_add_tasks_",
        {"tasks": [{"description": "Time in Lyon"}, {"description": "Time in Oslo"}]},
    )
    # A task's conversation starts with a brief naming the request and the task.
    brief = user(
        "Request: Compare Lyon and Oslo\nPlan: Time in Lyon; Time in Oslo\nNow: Time in Oslo"
    )
    assert decide(body(brief, tools=[CITY, REPORT]), CITY_SCRIPT) == Call(
        "city_datetime", {"city": "Oslo"}
    )
    first = user(
        "Request: Compare Lyon and Oslo\nPlan: Time in Lyon; Time in Oslo\nNow: Time in Lyon"
    )
    assert decide(body(first, tools=[CITY, REPORT]), CITY_SCRIPT) == Call(
        "city_datetime", {"city": "Lyon"}
    )
    answer = decide(body(user("Compare Lyon and Oslo")), CITY_SCRIPT)
    assert answer == Answer(demo_text("Compared Lyon and Oslo."), "I have what I need to answer.")


def test_the_summary_says_the_built_ins_results_in_words_and_failures_plainly() -> None:
    local = {
        "city": "Lyon",
        "timezone": "Europe/Paris",
        "date": "2030-01-02",
        "time": "09:05:00",
        "weekday": "Wednesday",
        "utcOffset": "+01:00",
    }
    weather = {
        "city": "Lyon",
        "date": "2030-01-02",
        "condition": "sunny",
        "tempHighC": 9,
        "tempLowC": 2,
        "humidityPct": 40,
        "windKph": 12,
    }
    failed = {
        "role": "tool",
        "tool_call_id": "d",
        "name": "city_datetime",
        "content": "Error: unknown city 'Atlantis': not one this tool knows",
    }
    done = body(
        user("Lyon?"),
        *called("city_datetime", local),
        *called("mock_city_weather", weather),
        failed,
        tools=[CITY, WEATHER],
        script={"calls": []},
    )
    answer = decide(done, Script(()))
    assert isinstance(answer, Answer)
    assert answer.text.split("\n") == [
        DEMO_LINE,
        "",
        "Here is what the tools found:",
        "- **Local time in Lyon**: 09:05 on Wednesday, 2030-01-02 (Europe/Paris, UTC+01:00)",
        "- **Weather in Lyon** on 2030-01-02: sunny, 2 to 9 °C, humidity 40%, wind 12 km/h "
        "(made-up demo data)",
        "- **city_datetime** could not answer: unknown city 'Atlantis': not one this tool knows",
    ]
    # No city named: the answer says which one the tools looked up.
    unnamed = body(
        user("Weather?"),
        *called("mock_city_weather", {**weather, "city": "Shanghai"}),
        tools=[WEATHER],
    )
    said = decide(unnamed, Script(()))
    assert isinstance(said, Answer)
    assert "You named no city I could make out, so I looked up Shanghai:" in said.text


def test_a_failed_time_look_up_leaves_the_weather_its_own_date() -> None:
    failed = {"role": "tool", "tool_call_id": "d", "name": "city_datetime", "content": "Error: x"}
    after = body(
        user("Weather in Atlantis"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "d",
                    "type": "function",
                    "function": {"name": "city_datetime", "arguments": "{}"},
                }
            ],
        },
        failed,
        tools=[CITY, WEATHER],
    )
    call = decide(after, Script())
    assert isinstance(call, Call) and call.arguments["city"] == "Atlantis"
    assert "{{" not in call.arguments["date"]  # no template on a result that failed


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"plan": [{"task": "a", "dependsOn": [None]}]}, r"plan\[0\].dependsOn must be a list"),
        ({"plan": [{"task": "a", "expectedOutput": 1}]}, r"plan\[0\].expectedOutput must be"),
        ({"plan": [{"task": "a", "requiredTools": "x"}]}, r"plan\[0\].requiredTools must be"),
        ({"replan": [{"decision": "stop"}]}, r"replan\[0\].decision must be continue, revise"),
        ({"replan": [{"decision": "revise"}]}, r"replan\[0\].plan must list the tasks"),
        ({"replan": [{"decision": "finish", "reason": 1}]}, r"replan\[0\].reason must be"),
        ({"verify": [{"verdict": "fail"}]}, r"verify\[0\].verdict must be pass or"),
        ({"verify": [{"verdict": "needsMorePlanning"}]}, r"verify\[0\].improvements must name"),
        ({"verify": {}}, "verify must be a list"),
        ([], "script must be an object"),
        ({"call": []}, r"unknown field\(s\) call"),
        ({"calls": {}}, "calls must be a list"),
        ({"calls": [{"tool": "no spaces"}]}, r"calls\[0\].tool must be a tool name"),
        ({"calls": [{"tool": "t", "arguments": []}]}, r"calls\[0\].arguments must be an object"),
        ({"plan": [{"task": " "}]}, r"plan\[0\].task must be a non-empty string"),
        ({"answer": 1}, "answer must be a string"),
    ],
)
def test_a_malformed_script_is_refused_with_where_and_why(raw: Any, message: str) -> None:
    with pytest.raises(ScriptError, match=message):
        Script.parse(raw)


# -- streaming ---------------------------------------------------------------------------


def test_answers_stream_word_by_word_and_calls_in_fragments() -> None:
    respond = demo_responder(0.0)
    thinking = body(user("Hi there"), enable_thinking=True)
    script = respond(thinking)
    assert isinstance(script, list)
    reasoning = [
        c["choices"][0]["delta"]["reasoning_content"] for c in _chunks(script, "reasoning")
    ]
    content = [c["choices"][0]["delta"]["content"] for c in _chunks(script, "content")]
    assert "".join(reasoning).startswith("The user wrote: “Hi there”.")
    answer = "".join(content)
    assert answer.startswith(f"{DEMO_LINE}\n\nYou said: “Hi there”.")  # the demo says so first
    assert content[0] == "_Demo "  # word by word
    assert script[-3:-1] == [lb.finish("stop") | {"created": script[-3]["created"]}, script[-2]]
    assert script[-1] is lb.DONE

    called_script = respond(body(user("Time in Paris"), tools=[CITY], script={"calls": []}))
    assert isinstance(called_script, list)
    assert _chunks(called_script, "tool_calls") == []  # the script makes no call: it answers

    call = respond(body(user("Time in Paris"), tools=[CITY]))
    assert isinstance(call, list)
    parts = [c["choices"][0]["delta"]["tool_calls"][0] for c in _chunks(call, "tool_calls")]
    assert parts[0]["function"]["name"] == "city_datetime" and parts[0]["id"].startswith("call_")
    assert json.loads("".join(p["function"]["arguments"] for p in parts)) == {"city": "Paris"}
    assert all(len(p["function"]["arguments"]) <= 12 for p in parts)
    assert call[-3]["choices"][0]["finish_reason"] == "tool_calls"


def _chunks(script: list[lb.ScriptItem], key: str) -> list[dict[str, Any]]:
    field = {"reasoning": "reasoning_content"}.get(key, key)
    return [
        item
        for item in script
        if isinstance(item, dict) and item.get("choices") and field in item["choices"][0]["delta"]
    ]
