"""The built-in backend tools of the service, configured with plain values."""

from __future__ import annotations

from service.builtins.ask_user import ask_user_tool
from service.builtins.bash import BashOptions, bash_tool
from service.builtins.city_datetime import city_datetime_tool
from service.builtins.weather import mock_city_weather_tool
from service.core.tools.registry import BackendTool


def builtin_tools(bash: BashOptions, ask_user_timeout_s: float) -> list[BackendTool]:
    """`_bash_`, `ask_user`, `city_datetime` and the demo weather tool `mock_city_weather`.

    `ask_user_timeout_s` is how long `ask_user` waits for the user's answer.
    """
    return [
        bash_tool(bash),
        ask_user_tool(ask_user_timeout_s),
        city_datetime_tool(),
        mock_city_weather_tool(),
    ]
