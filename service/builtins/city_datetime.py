"""The built-in `city_datetime` tool: the current date and time of a city."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from service.core.tools.definitions import ToolDefinition, ToolError
from service.core.tools.registry import BackendTool, ToolCallInfo

#: Lower-cased city names (English and Chinese) → IANA time zone.
CITY_ZONES: dict[str, str] = {
    "beijing": "Asia/Shanghai",
    "北京": "Asia/Shanghai",
    "shanghai": "Asia/Shanghai",
    "上海": "Asia/Shanghai",
    "shenzhen": "Asia/Shanghai",
    "深圳": "Asia/Shanghai",
    "guangzhou": "Asia/Shanghai",
    "广州": "Asia/Shanghai",
    "hangzhou": "Asia/Shanghai",
    "杭州": "Asia/Shanghai",
    "chengdu": "Asia/Shanghai",
    "成都": "Asia/Shanghai",
    "hong kong": "Asia/Hong_Kong",
    "香港": "Asia/Hong_Kong",
    "taipei": "Asia/Taipei",
    "tokyo": "Asia/Tokyo",
    "东京": "Asia/Tokyo",
    "seoul": "Asia/Seoul",
    "singapore": "Asia/Singapore",
    "bangkok": "Asia/Bangkok",
    "new delhi": "Asia/Kolkata",
    "delhi": "Asia/Kolkata",
    "mumbai": "Asia/Kolkata",
    "dubai": "Asia/Dubai",
    "moscow": "Europe/Moscow",
    "istanbul": "Europe/Istanbul",
    "berlin": "Europe/Berlin",
    "paris": "Europe/Paris",
    "巴黎": "Europe/Paris",
    "london": "Europe/London",
    "伦敦": "Europe/London",
    "madrid": "Europe/Madrid",
    "rome": "Europe/Rome",
    "amsterdam": "Europe/Amsterdam",
    "new york": "America/New_York",
    "纽约": "America/New_York",
    "chicago": "America/Chicago",
    "los angeles": "America/Los_Angeles",
    "san francisco": "America/Los_Angeles",
    "toronto": "America/Toronto",
    "vancouver": "America/Vancouver",
    "mexico city": "America/Mexico_City",
    "são paulo": "America/Sao_Paulo",
    "sao paulo": "America/Sao_Paulo",
    "sydney": "Australia/Sydney",
    "melbourne": "Australia/Melbourne",
    "auckland": "Pacific/Auckland",
    "cairo": "Africa/Cairo",
    "johannesburg": "Africa/Johannesburg",
    "nairobi": "Africa/Nairobi",
}

DEFINITION = ToolDefinition(
    name="city_datetime",
    kind="backend",
    idempotent=True,  # it only reads the clock
    description="The current local date and time of a city (or of an IANA time zone).",
    parameters={
        "type": "object",
        "properties": {
            "city": {
                "type": "string",
                "description": "City name, e.g. 'Shanghai' or 'New York', or a time zone.",
            }
        },
        "required": ["city"],
    },
    after_call_hint="Quote the local date and time exactly as returned; do not convert them.",
    timeout_s=5.0,
)

Clock = Callable[[], datetime]


def zone_of(city: str) -> ZoneInfo:
    """The time zone of `city` (a known city name or an IANA zone); ToolError otherwise."""
    name = CITY_ZONES.get(" ".join(city.lower().split()))
    try:
        return ZoneInfo(name or city.strip())
    except (ZoneInfoNotFoundError, ValueError):
        known = ", ".join(sorted(k.title() for k in CITY_ZONES if k.isascii())[:12])
        raise ToolError(f"unknown city {city!r}; try a city such as {known}") from None


class CityDatetime:
    """The tool's implementation; `clock` gives the current UTC time."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or (lambda: datetime.now(UTC))

    async def __call__(self, arguments: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
        city = arguments.get("city")
        if not isinstance(city, str) or not city.strip():
            raise ToolError("'city' must be a non-empty string")
        zone = zone_of(city)
        local = self.clock().astimezone(zone)
        offset = local.strftime("%z")
        return {
            "city": city.strip(),
            "timezone": zone.key,
            "date": local.date().isoformat(),
            "time": local.strftime("%H:%M:%S"),
            "weekday": local.strftime("%A"),
            "utcOffset": f"{offset[:3]}:{offset[3:]}",
            "iso": local.isoformat(timespec="seconds"),
        }


def city_datetime_tool(clock: Clock | None = None) -> BackendTool:
    return BackendTool(DEFINITION, CityDatetime(clock))
