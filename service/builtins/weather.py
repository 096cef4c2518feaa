"""The built-in demo weather tool `mock_city_weather`: plausible, repeatable, made-up weather.

The same city and date always give the same weather, so demos and tests are
repeatable; nothing is fetched from anywhere.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from service.builtins.city_datetime import Clock, zone_name
from service.core.tools.definitions import ToolDefinition, ToolError
from service.core.tools.registry import BackendTool, ToolCallInfo

CONDITIONS = ("sunny", "partly cloudy", "cloudy", "light rain", "showers", "windy", "foggy")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")

DEFINITION = ToolDefinition(
    name="mock_city_weather",
    kind="backend",
    description="The weather forecast of a city on a date (demo data, not a real forecast).",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name, e.g. 'Shanghai'."},
            "date": {
                "type": "string",
                "description": "Date as YYYY-MM-DD; today in that city when omitted.",
            },
        },
        "required": ["city"],
    },
    after_call_hint="Say that the weather comes from demo data.",
    timeout_s=5.0,
    cacheable=True,  # the same city and date always give the same weather
    idempotent=True,
)


class MockCityWeather:
    """The tool's implementation; `clock` gives the current UTC time (for the default date)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or (lambda: datetime.now(UTC))

    async def __call__(self, arguments: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
        city = arguments.get("city")
        if not isinstance(city, str) or not city.strip():
            raise ToolError("'city' must be a non-empty string")
        date = arguments.get("date") or self.today(city)
        if not isinstance(date, str) or not _DATE.match(date):
            raise ToolError(f"'date' must be YYYY-MM-DD (got {date!r})")
        return forecast(city.strip(), date)

    def today(self, city: str) -> str:
        """Today's date in `city`: its time zone's when known, else UTC's (any city has
        made-up weather)."""
        zone = zone_name(city)
        return self.clock().astimezone(ZoneInfo(zone) if zone else UTC).date().isoformat()


def forecast(city: str, date: str) -> dict[str, Any]:
    """The made-up weather of `city` on `date`."""
    seed = hashlib.sha256(f"{city.lower()}|{date}".encode()).digest()
    high = 8 + seed[1] % 24
    return {
        "city": city,
        "date": date,
        "condition": CONDITIONS[seed[0] % len(CONDITIONS)],
        "tempHighC": high,
        "tempLowC": high - 4 - seed[2] % 7,
        "humidityPct": 35 + seed[3] % 55,
        "windKph": 3 + seed[4] % 30,
        "source": "demo data",
    }


def mock_city_weather_tool(clock: Clock | None = None) -> BackendTool:
    return BackendTool(DEFINITION, MockCityWeather(clock))
