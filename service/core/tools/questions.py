"""Questions to the user: a tool may ask, the run waits for the answer through Submit.

`ask` emits `question.ask` (a `q_` id, the question, its options, the time-out),
waits for `Submit(toolId = that id)`, and emits `question.answer`; the answer is
returned to the tool — or, with no answer in time, ToolError tells the model.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from service.core import events
from service.core.eventlog import Emitter
from service.core.ports import RunBus
from service.core.tools.definitions import ToolError
from service.core.waits import WaitTimedOut


async def ask(out: Emitter, bus: RunBus, question: str, options: Sequence[str] = ()) -> Any:
    """The user's answer to `question` (with `options` to choose from, when given)."""
    question_id = "q_" + secrets.token_hex(4)
    out.emit(
        events.make(
            "question_ask",
            question_id=question_id,
            question=question,
            options=list(options),
            timeout_ms=round(bus.wait_timeout_s * 1000),
        )
    )
    try:
        answer = await bus.wait(out, question_id, "question")
    except WaitTimedOut as timed_out:
        out.emit(events.make("question_answer", question_id=question_id, timed_out=True))
        raise ToolError(f"the user did not answer within {timed_out.timeout_s:g} s") from None
    out.emit(
        events.make("question_answer", question_id=question_id, answer=events.to_value(answer))
    )
    return answer
