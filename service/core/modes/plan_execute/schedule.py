"""The execution of a plan's tasks: a graph of their dependencies, run with bounded concurrency.

A task is ready when every task it depends on is completed; ready tasks start in
plan order, at most `planExecute.execute.parallel` at once (1, the default: one
after another, exactly in plan order). Each task starts with `task.start` and
`plan.update` emitted here, then works in its own asyncio task, its events
carrying its `taskId`, so the events of concurrent tasks interleave on the run's
stream. A task whose dependency failed or was canceled is skipped: it is never
started (no `task.*` event), its status becomes canceled, and a `plan.update`
shows it; tasks that do not depend on it go on.

With a replanner (`planExecute.replan`) the tasks run in waves: the ready tasks
(at most `parallel`) start together, and when all of them have ended the
replanner decides how the plan goes on — unless no task remains to be started,
or (`onlyAfterFailure`) every task of the wave completed.

An error of the run in one task (a budget, the provider) cancels the tasks
running beside it and ends the run; so does the run's cancellation.
"""

from __future__ import annotations

import asyncio

from service.core import events
from service.core.modes.plan_execute.replanner import Replanner
from service.core.modes.plan_execute.tasks import begin, execute_task
from service.core.run.context import RunContext
from service.core.tools.planning import Plan, Task


class Schedule:
    """Runs the tasks of a plan that have not started yet, to the end of the plan."""

    def __init__(self, ctx: RunContext, plan: Plan, replanner: Replanner | None = None) -> None:
        self.ctx = ctx
        self.plan = plan
        self.replanner = replanner
        self.limit = ctx.agent.plan_parallel
        self.running: dict[asyncio.Task[None], Task] = {}

    async def run(self) -> None:
        wave: list[Task] = []
        try:
            while True:
                self._skip_blocked()
                for task in self._ready()[: self.limit - len(self.running)]:
                    self._start(task)
                    if self.replanner is not None:
                        wave.append(task)
                if not self.running:
                    return
                await self._settle()
                if self.replanner is not None and not self.running:
                    await self._replan(wave)
                    wave = []
        finally:
            await self._stop()

    def _ready(self) -> list[Task]:
        done = {t.task_id for t in self.plan.tasks if t.status == "completed"}
        return [t for t in self.plan.remaining if all(d in done for d in t.depends_on)]

    def _skip_blocked(self) -> None:
        """Cancel the tasks not started whose dependency failed or was canceled."""
        status = {t.task_id: t.status for t in self.plan.tasks}
        skipped = False
        for task in self.plan.remaining:  # plan order: a dependency is seen before its tasks
            blocking = [d for d in task.depends_on if status[d] in ("failed", "canceled")]
            if blocking:
                what = "failed" if status[blocking[0]] == "failed" else "was canceled"
                task.status, task.result = "canceled", f"skipped: {blocking[0]} {what}"
                status[task.task_id] = "canceled"
                skipped = True
        if skipped:
            self.ctx.out.emit(events.plan_update(self.plan.plan_id, self.plan.to_pb()))

    def _start(self, task: Task) -> None:
        scoped = begin(self.ctx, self.plan, task)
        job = asyncio.create_task(execute_task(scoped, self.plan, task), name=task.task_id)
        self.running[job] = task

    async def _settle(self) -> None:
        """Wait for a running task to end (with a replanner: for all of them)."""
        when = asyncio.FIRST_EXCEPTION if self.replanner is not None else asyncio.FIRST_COMPLETED
        done, _ = await asyncio.wait(self.running, return_when=when)
        order = {t.task_id: i for i, t in enumerate(self.plan.tasks)}
        errors = []
        for job in sorted(done, key=lambda j: order[self.running[j].task_id]):
            del self.running[job]
            if job.cancelled():
                raise asyncio.CancelledError
            error = job.exception()
            if error is not None:
                errors.append(error)
        if errors:
            raise errors[0]

    async def _replan(self, wave: list[Task]) -> None:
        assert self.replanner is not None
        if not self.plan.remaining:  # nothing left to decide on
            return
        failed = any(t.status != "completed" for t in wave)
        if self.ctx.agent.replan_only_after_failure and not failed:
            return
        await self.replanner.decide(wave)

    async def _stop(self) -> None:
        """Cancel the tasks still running (the run failed or was cancelled) and wait for them."""
        jobs = list(self.running)
        self.running.clear()
        for job in jobs:
            job.cancel()
        if jobs:
            await asyncio.gather(*jobs, return_exceptions=True)
