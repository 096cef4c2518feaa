"""The modes an agent runs in, by the name its file gives them (`"mode": "REACT"`).

A mode is a coroutine taking the run's `RunContext` and returning its `Outcome`;
it emits through `ctx.out` and ends normally or by raising (the runner turns
either into the run's one terminal event). Adding a mode is a new module here
plus one line in `MODES` (and the name in the agent schema's `mode` enum).
"""

from __future__ import annotations

from service.core.modes.oneshot import run_oneshot
from service.core.modes.plan_execute import run_plan_execute
from service.core.modes.react import run_react
from service.core.run.context import Mode

MODES: dict[str, Mode] = {
    "ONESHOT": run_oneshot,
    "REACT": run_react,
    "PLAN_EXECUTE": run_plan_execute,
}
