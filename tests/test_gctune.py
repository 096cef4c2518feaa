"""The service process's garbage collector: start-up's objects frozen, higher thresholds."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from service.process import gctune


@pytest.fixture
def restored() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_tune_freezes_what_exists_and_raises_the_thresholds(restored: None) -> None:
    kept = [object() for _ in range(3)], {"a": [1]}
    gctune.tune()
    assert gc.get_threshold() == gctune.THRESHOLDS
    assert gc.get_freeze_count() > 0
    assert all(gc.is_tracked(obj) for obj in kept)  # frozen objects stay alive and tracked
