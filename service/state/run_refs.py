"""A run of this process as the `RunBus` port describes it: the in-process bus answers
with these, and so does the Redis bus for the runs its replica executes."""

from __future__ import annotations

from service.core.run.state import RunState
from service.core.run.waits import Waits
from service.core.values import LiveRun, RunRef


def ref(run: RunState) -> RunRef:
    """A run of this process as `RunBus.find` describes it."""
    return RunRef(run.run_id, run.chat_id, run.owner, running=not run.done)


def live(run: RunState, waits: Waits) -> LiveRun:
    """A run of this process as `RunBus.live_of` describes it."""
    last_seq = run.log[-1].seq if len(run.log) else 0
    return LiveRun(
        run.run_id, run.chat_id, run.owner, run.agent_key, last_seq, waits.open_waits(run.run_id)
    )
