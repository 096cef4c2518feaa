"""The built-in backend tools of the service, configured from the settings."""

from __future__ import annotations

from service.builtins.ask_user import ask_user_tool
from service.builtins.bash import bash_tool
from service.builtins.city_datetime import city_datetime_tool
from service.builtins.weather import mock_city_weather_tool
from service.config import Settings
from service.core.tools.registry import BackendTool


def builtin_tools(settings: Settings) -> list[BackendTool]:
    """`_bash_`, `ask_user`, `city_datetime` and the demo weather tool `mock_city_weather`."""
    return [
        bash_tool(settings),
        ask_user_tool(settings.frontend_wait_timeout_s),
        city_datetime_tool(),
        mock_city_weather_tool(),
    ]
