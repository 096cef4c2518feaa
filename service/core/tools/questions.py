"""Questions to the user: a tool may ask, the run waits for the answer through Submit.

`ask` emits `question.ask` (a `q_` id, the question, its options, the time-out),
waits for `Submit(toolId = that id)`, and emits `question.answer`; the answer is
returned to the tool — or, with no answer in time, ToolError tells the model.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from agw.v1 import events_pb2 as pb

from service.core import events
from service.core.run import Run
from service.core.tools.definitions import ToolError
from service.core.waits import Waits, WaitTimedOut


async def ask(run: Run, waits: Waits, question: str, options: Sequence[str] = ()) -> Any:
    """The user's answer to `question` (with `options` to choose from, when given)."""
    question_id = "q_" + secrets.token_hex(4)
    run.emit(
        pb.Event(
            question_ask=pb.QuestionAsk(
                question_id=question_id,
                question=question,
                options=list(options),
                timeout_ms=round(waits.timeout_s * 1000),
            )
        )
    )
    try:
        answer = await waits.wait(run, question_id, "question")
    except WaitTimedOut as timed_out:
        run.emit(
            pb.Event(question_answer=pb.QuestionAnswer(question_id=question_id, timed_out=True))
        )
        raise ToolError(f"the user did not answer within {timed_out.timeout_s:g} s") from None
    run.emit(
        pb.Event(
            question_answer=pb.QuestionAnswer(
                question_id=question_id, answer=events.to_value(answer)
            )
        )
    )
    return answer
