"""Questions to the user: a tool may ask, the run waits for the answer through Submit.

`ask` emits `question.ask` (a `q_` id, the question, its options, the time-out),
waits for `Submit(toolId = that id)`, and emits `question.answer`; the answer is
returned to the tool — or, with no answer in time, ToolError tells the model.

Options are labels, or typed `Option`s (a label, what choosing it means,
whether it is recommended); the event carries the labels in `options` and,
when an option is more than a label, the typed `choices` too. A question may
let the user choose several options (`multi_select`: the answer is the list of
labels) and answer in their own words besides (`allow_free_text`). The answer
reaches the tool as the client submitted it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.core import events
from service.core.run.eventlog import Emitter
from service.core.run.waits import Waits, WaitTimedOut
from service.core.tools.definitions import ToolError


@dataclass(frozen=True, slots=True)
class Option:
    """One option of a question."""

    label: str
    description: str = ""
    recommended: bool = False


async def ask(
    out: Emitter,
    waits: Waits,
    question: str,
    options: Sequence[str | Option] = (),
    *,
    multi_select: bool = False,
    allow_free_text: bool = False,
) -> Any:
    """The user's answer to `question` (with `options` to choose from, when given)."""
    question_id = out.token("q_")
    typed = [o if isinstance(o, Option) else Option(o) for o in options]
    out.emit(
        events.question_ask(
            question_id,
            question,
            [(o.label, o.description, o.recommended) for o in typed],
            timeout_ms=round(waits.timeout_s * 1000),
            multi_select=multi_select,
            allow_free_text=allow_free_text,
        )
    )
    try:
        answer = await waits.wait(out, question_id, "question", kind="question")
    except WaitTimedOut as timed_out:
        out.emit(events.make("question_answer", question_id=question_id, timed_out=True))
        raise ToolError(f"the user did not answer within {timed_out.timeout_s:g} s") from None
    out.emit(
        events.make("question_answer", question_id=question_id, answer=events.to_value(answer))
    )
    return answer
