"""The event loop setting: auto takes uvloop where installed, asyncio's loop on request."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from service.assembly.config import Settings
from service.process import eventloop

HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


def test_asyncio_is_the_standard_library_loop() -> None:
    assert eventloop.loop_factory("asyncio") is None
    assert eventloop.loop_name("asyncio") == "asyncio"
    assert eventloop.run(_loop_module(), "asyncio") == "asyncio"


@pytest.mark.skipif(not HAVE_UVLOOP, reason="uvloop is not installed here")
@pytest.mark.parametrize("choice", ["auto", "uvloop"])
def test_auto_and_uvloop_run_on_uvloop(choice: str) -> None:
    assert eventloop.loop_name(choice) == "uvloop"
    assert eventloop.run(_loop_module(), choice) == "uvloop"


def test_an_unknown_choice_is_refused_and_its_coroutine_closed() -> None:
    coroutine = _loop_module()
    with pytest.raises(ValueError, match="choose among auto, asyncio, uvloop"):
        eventloop.run(coroutine, "trio")
    assert coroutine.cr_frame is None  # closed: no "never awaited" warning


def test_the_setting_defaults_to_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().event_loop == "auto"
    monkeypatch.setenv("AGW_EVENT_LOOP", "asyncio")
    assert Settings().event_loop == "asyncio"
