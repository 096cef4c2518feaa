"""The paced load's rate: one ramp step below what both servers sustained, and lower again
when one of them did not sustain the load's longer streams."""

from __future__ import annotations

from bench.options import Sizes
from bench.suite import _at_common_rate, _step_down

SIZES = Sizes()  # the default run: ramp from 100 streams by 50, the load at most 200


def ramped(relay: int, gateway: int) -> dict[str, dict[str, object]]:
    return {
        "relay-aiohttp": {"capacity_streams": relay},
        "gateway": {"capacity_streams": gateway},
    }


def test_the_load_runs_one_step_below_what_both_sustained() -> None:
    assert _at_common_rate(SIZES, ramped(300, 250)).load_streams == 200
    assert _at_common_rate(SIZES, ramped(300, 200)).load_streams == 150


def test_a_load_one_server_did_not_sustain_runs_again_one_step_lower_twice_at_most() -> None:
    figures = ramped(300, 300)
    first = _at_common_rate(SIZES, figures)
    figures["relay-aiohttp"]["load_sustained"] = True
    figures["gateway"]["load_sustained"] = False
    lower = _step_down(first, first, figures)
    assert lower is not None and lower.load_streams == 150
    lowest = _step_down(lower, first, figures)
    assert lowest is not None and lowest.load_streams == 100
    assert _step_down(lowest, first, figures) is None  # two steps below, at most
    figures["gateway"]["load_sustained"] = True
    assert _step_down(first, first, figures) is None  # both sustained it: it stands


def test_the_load_never_goes_below_the_ramps_first_step() -> None:
    figures = ramped(150, 150)
    first = _at_common_rate(SIZES, figures)
    assert first.load_streams == 100
    figures["gateway"]["load_sustained"] = False
    assert _step_down(first, first, figures) is None
