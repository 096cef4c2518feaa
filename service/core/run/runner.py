"""Executes one run: runs its mode in a `RunContext` and ends the run with one terminal event.

The front door builds the run's context (`new_context` in context.py: the
agent, the query, each stage's model bound once, the run's policies and tool
executor) and starts `execute` as the run's task.

The runner owns the run's lifecycle. Whatever the mode does, the run ends with
exactly one terminal event: `run.complete` when the mode returns (or raises
`RunStopped`: the user ended the run, e.g. at a doom loop), `run.error`
for a failure (with the failure's stable reason; also one met outside the task,
`RunState.fail`, which stops the task), `run.cancel` when the run's task is
cancelled — and `CancelledError` is re-raised, never swallowed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import AbstractContextManager

from opentelemetry import trace

from service.core import events, timers
from service.core.errors import AgwError, BudgetExhausted
from service.core.run import observation
from service.core.run.context import Mode, RunContext, RunStopped
from service.core.run.state import SUSPENDS, RunState

log = logging.getLogger("agw.run")


async def execute(ctx: RunContext, mode: Mode) -> None:
    """Run `mode` under the agent's time budget, in the run's span, and end the run with
    one terminal event; record the run's metrics (a run that goes on after a resumption or
    parking is not started again; one stopped to go on later has not ended). One coroutine:
    its frame is held for as long as the run runs."""
    run = ctx.run
    labels = observation.run_labels(ctx.agent.key, ctx.agent.mode)
    if run.log.replay is None:
        observation.runs_started.add(1, labels)
    timeout_ms = ctx.agent.budget.timeout_ms
    left_ms = timeout_ms  # counted from the run's start: a resumed run has only the rest
    if started_ms := ctx.command.started_at_ms:
        left_ms = min(timeout_ms, started_ms + timeout_ms - time.time_ns() // 1_000_000)
    with _span(ctx, labels):
        try:
            async with timers.timeout(max(left_ms, 0) / 1000) as deadline:
                try:
                    outcome = await mode(ctx)
                except TimeoutError:
                    if deadline.expired():
                        raise
                    raise AgwError("operation timed out") from None
        except TimeoutError:
            error = BudgetExhausted(
                f"run exceeded its timeoutMs budget of {timeout_ms} ms", budget="timeoutMs"
            )
            run.log.finish(events.run_error(error.reason, error.message, error.metadata))
        except asyncio.CancelledError:
            failure = run.failure
            if failure is not None:  # failed from outside the task (see `RunState.fail`)
                run.log.finish(events.run_error(failure.reason, failure.message, failure.metadata))
            elif run.cancel_reason not in SUSPENDS:  # handed over or parked: it goes on later
                run.log.finish(events.run_cancel(run.cancel_reason or "cancel"))
            raise
        except RunStopped as stopped:
            finish_reason = stopped.finish_reason
            run.log.finish(events.run_complete(finish_reason, events.usage(run.accounting.usage)))
        except AgwError as error:
            log.warning("run %s failed: %s", run.run_id, error.message)
            run.log.finish(events.run_error(error.reason, error.message, error.metadata))
        except Exception as error:  # a bug: report it on the stream, keep serving
            log.exception("run %s failed unexpectedly", run.run_id)
            run.log.finish(events.run_error("INTERNAL", f"internal error ({type(error).__name__})"))
        else:
            used = run.accounting.usage  # every call of the run
            total = used if used is not None else outcome.usage
            run.log.finish(events.run_complete(outcome.finish_reason, events.usage(total)))
        finally:
            _ended(run, labels)


def _ended(run: RunState, labels: dict[str, str]) -> None:
    """The run's outcome on its span (the current one) and in its metrics."""
    terminal = run.terminal
    field = terminal.WhichOneof("payload") if terminal is not None else "run_cancel"
    outcome = observation.OUTCOMES.get(field or "", "cancelled")
    if terminal is None and run.cancel_reason in SUSPENDS:
        outcome = "suspended"
    span = trace.get_current_span()
    span.set_attribute("agw.outcome", outcome)
    if field == "run_error" and terminal is not None:
        span.set_status(trace.StatusCode.ERROR, terminal.run_error.error.message)
    if outcome != "suspended":
        observation.runs_ended.add(1, {**labels, "agw.outcome": outcome})


def _span(ctx: RunContext, labels: dict[str, str]) -> AbstractContextManager[trace.Span]:
    """The run's span; without tracing, the shared no-op (no attributes kept while it runs)."""
    if not observation.tracing():
        return observation.NO_SPAN
    run = ctx.run
    attributes = {**labels, "agw.run_id": run.run_id, "agw.chat_id": run.chat_id}
    return observation.span(f"run {ctx.agent.key}", attributes=attributes)
