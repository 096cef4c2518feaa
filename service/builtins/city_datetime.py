"""The built-in `city_datetime` tool: the current date and time of a city.

A city is found in `CITY_ZONES` (major cities, in English and some in Chinese), else
by the city an IANA zone is named after ("Zurich" → Europe/Zurich, "Buenos Aires" →
America/Argentina/Buenos_Aires), else it may be given as a zone itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

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
    # Cities no IANA zone is named after (those that are, e.g. Lisbon, are found by name).
    "lyon": "Europe/Paris",
    "marseille": "Europe/Paris",
    "toulouse": "Europe/Paris",
    "bordeaux": "Europe/Paris",
    "strasbourg": "Europe/Paris",
    "barcelona": "Europe/Madrid",
    "valencia": "Europe/Madrid",
    "seville": "Europe/Madrid",
    "porto": "Europe/Lisbon",
    "munich": "Europe/Berlin",
    "hamburg": "Europe/Berlin",
    "frankfurt": "Europe/Berlin",
    "cologne": "Europe/Berlin",
    "milan": "Europe/Rome",
    "naples": "Europe/Rome",
    "florence": "Europe/Rome",
    "venice": "Europe/Rome",
    "geneva": "Europe/Zurich",
    "edinburgh": "Europe/London",
    "manchester": "Europe/London",
    "kyiv": "Europe/Kyiv",
    "kiev": "Europe/Kyiv",
    "st petersburg": "Europe/Moscow",
    "saint petersburg": "Europe/Moscow",
    "osaka": "Asia/Tokyo",
    "kyoto": "Asia/Tokyo",
    "busan": "Asia/Seoul",
    "xi'an": "Asia/Shanghai",
    "xian": "Asia/Shanghai",
    "wuhan": "Asia/Shanghai",
    "nanjing": "Asia/Shanghai",
    "chongqing": "Asia/Shanghai",
    "tianjin": "Asia/Shanghai",
    "bangalore": "Asia/Kolkata",
    "bengaluru": "Asia/Kolkata",
    "chennai": "Asia/Kolkata",
    "hanoi": "Asia/Bangkok",
    "abu dhabi": "Asia/Dubai",
    "tel aviv": "Asia/Jerusalem",
    "boston": "America/New_York",
    "washington": "America/New_York",
    "miami": "America/New_York",
    "atlanta": "America/New_York",
    "philadelphia": "America/New_York",
    "seattle": "America/Los_Angeles",
    "portland": "America/Los_Angeles",
    "las vegas": "America/Los_Angeles",
    "san diego": "America/Los_Angeles",
    "houston": "America/Chicago",
    "dallas": "America/Chicago",
    "austin": "America/Chicago",
    "new orleans": "America/Chicago",
    "montreal": "America/Toronto",
    "rio de janeiro": "America/Sao_Paulo",
    "cape town": "Africa/Johannesburg",
    "marrakesh": "Africa/Casablanca",
}

#: Areas of the zone database whose place names are not cities people name, and names
#: of old aliases that are not places ("Australia/North", "America/North_Dakota/Center").
_NOT_CITY_WORDS = frozenset({"north", "south", "west", "act", "nsw", "lhi", "center", "virgin"})
_NOT_CITIES = (
    "Etc/",
    "SystemV/",
    "US/",
    "Canada/",
    "Mexico/",
    "Brazil/",
    "Chile/",
    "Antarctica/",
    "Arctic/",
    "Indian/",
)

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


@functools.cache
def zone_cities() -> dict[str, str]:
    """The cities IANA zones are named after, lower-cased ("buenos aires") → the zone."""
    found: dict[str, str] = {}
    for name in sorted(available_timezones()):
        area, _, place = name.rpartition("/")
        city = place.replace("_", " ").lower()
        if area and not name.startswith(_NOT_CITIES) and city not in _NOT_CITY_WORDS:
            found.setdefault(city, name)
    return found


def zone_name(city: str) -> str | None:
    """The IANA zone of `city` (a known city, a city a zone is named after, or a zone)."""
    key = " ".join(city.lower().split())
    name = CITY_ZONES.get(key) or zone_cities().get(key) or city.strip()
    try:
        return ZoneInfo(name).key
    except (ZoneInfoNotFoundError, ValueError):
        return None


def zone_of(city: str) -> ZoneInfo:
    """The time zone of `city` (see `zone_name`); ToolError otherwise."""
    name = zone_name(city)
    if name is None:
        raise ToolError(
            f"unknown city {city!r}: not one this tool knows; name a larger city nearby, "
            "or give its IANA time zone (e.g. 'Europe/Paris')"
        )
    return ZoneInfo(name)


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
