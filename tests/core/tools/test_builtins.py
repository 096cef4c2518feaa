"""The built-in backend tools: city_datetime, mock_city_weather, and the _bash_ tool's wiring."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from service.assembly.app import bash_options
from service.assembly.config import Settings
from service.builtins.bash import BashOptions, bash_tool, describe, policy_from
from service.builtins.builtin import builtin_tools
from service.builtins.city_datetime import CityDatetime
from service.builtins.sandbox import SandboxResult
from service.builtins.weather import MockCityWeather, forecast
from service.core.tools.definitions import ToolError
from service.core.tools.registry import ToolCallInfo

CALL = ToolCallInfo("run", "chat", "call_1", "tool")
NOW = datetime(2025, 3, 1, 20, 15, 5, tzinfo=UTC)


async def test_city_datetime() -> None:
    tool = CityDatetime(lambda: NOW)
    assert await tool({"city": " new  york "}, CALL) == {
        "city": "new  york",
        "timezone": "America/New_York",
        "date": "2025-03-01",
        "time": "15:15:05",
        "weekday": "Saturday",
        "utcOffset": "-05:00",
        "iso": "2025-03-01T15:15:05-05:00",
    }
    shanghai = await tool({"city": "上海"}, CALL)
    assert (shanghai["date"], shanghai["time"]) == ("2025-03-02", "04:15:05")
    assert (await tool({"city": "Europe/Lisbon"}, CALL))["timezone"] == "Europe/Lisbon"
    with pytest.raises(ToolError, match=r"unknown city 'Atlantis': not one this tool knows"):
        await tool({"city": "Atlantis"}, CALL)
    with pytest.raises(ToolError, match="'city' must be a non-empty string"):
        await tool({}, CALL)


async def test_city_datetime_knows_the_cities_zones_are_named_after_and_more() -> None:
    tool = CityDatetime(lambda: NOW)
    assert (await tool({"city": "Lyon"}, CALL))["timezone"] == "Europe/Paris"  # listed
    assert (await tool({"city": "zurich"}, CALL))["timezone"] == "Europe/Zurich"  # a zone's city
    assert (await tool({"city": "Buenos Aires"}, CALL))["timezone"] == (
        "America/Argentina/Buenos_Aires"
    )
    assert (await tool({"city": "Honolulu"}, CALL))["time"] == "10:15:05"
    for not_a_city in ("north", "center"):  # old aliases, not places
        with pytest.raises(ToolError, match="unknown city"):
            await tool({"city": not_a_city}, CALL)


async def test_mock_city_weather_is_repeatable() -> None:
    tool = MockCityWeather(lambda: NOW)
    first = await tool({"city": "Paris", "date": "2025-03-02"}, CALL)
    assert first == await tool({"city": "Paris", "date": "2025-03-02"}, CALL)
    assert first == forecast("Paris", "2025-03-02")
    assert set(first) == {
        "city",
        "date",
        "condition",
        "tempHighC",
        "tempLowC",
        "humidityPct",
        "windKph",
        "source",
    }
    assert first["tempLowC"] < first["tempHighC"]
    assert (await tool({"city": "Tokyo"}, CALL))["date"] == "2025-03-02"  # today in Tokyo
    # Any city has made-up weather; one of no known zone has the UTC date's.
    assert (await tool({"city": "Atlantis"}, CALL))["date"] == "2025-03-01"
    with pytest.raises(ToolError, match="'date' must be YYYY-MM-DD"):
        await tool({"city": "Paris", "date": "tomorrow"}, CALL)


def test_bash_settings_become_the_sandbox_policy(tmp_path: Path) -> None:
    settings = Settings(
        bash_working_dir=tmp_path / "work",
        bash_allowed_paths=[tmp_path / "data"],
        bash_timeout_s=3,
        bash_output_limit_bytes=1000,
        bash_memory_limit_bytes=64 * 1024 * 1024,
        bash_max_processes=8,
    )
    options = bash_options(settings)
    assert options == BashOptions(
        working_dir=tmp_path / "work",
        allowed_paths=(tmp_path / "data",),
        timeout_s=3,
        output_limit_bytes=1000,
        memory_limit_bytes=64 * 1024 * 1024,
        max_processes=8,
        network=False,
    )
    policy = policy_from(options)
    assert policy.working_dir == (tmp_path / "work").resolve()
    assert policy.allowed_paths == ((tmp_path / "data").resolve(),)
    assert (policy.timeout_s, policy.output_limit_bytes, policy.max_processes) == (3, 1000, 8)
    assert (policy.memory_limit_bytes, policy.network) == (64 * 1024 * 1024, False)
    tool = bash_tool(options)
    # the wait for a free sandbox (at most the time-out), the command, and a margin
    assert tool.definition.name == "_bash_" and tool.definition.timeout_s == 11
    assert "no network access" in tool.definition.description
    builtins = builtin_tools(options, 300.0)
    assert [t.definition.name for t in builtins] == [
        "_bash_",
        "ask_user",
        "city_datetime",
        "mock_city_weather",
    ]
    assert builtins[1].definition.timeout_s == 305  # the wait for the answer, and a margin


def test_bash_result_text() -> None:
    result = SandboxResult("hi\n", "", None, True, False, 10_012.4)
    assert describe(result) == (
        "exit_code: none (killed)\ntimed_out: true\noutput_truncated: false\n"
        "duration_ms: 10012\nstdout:\nhi\nstderr:\n"
    )


async def test_bash_refuses_an_empty_command(tmp_path: Path) -> None:
    tool = bash_tool(BashOptions(working_dir=tmp_path))
    with pytest.raises(ToolError, match="'command' must be a non-empty string"):
        await tool.handler({"command": "  "}, CALL)
