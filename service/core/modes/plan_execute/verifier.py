"""The verifier of PLAN_EXECUTE: judges the plan's results against the request.

Configured by `planExecute.verify` (its system prompt, optionally its model, and
`maxRounds`, default 3: planning rounds at most, the first included). After the
tasks have run, the verifier answers with `_plan_verify_`: `pass`, or
`needsMorePlanning` with the improvements a further planning round must bring.
Its conversation lasts the run, so a later verdict sees the earlier ones. A
verifier that gives no valid verdict, even when asked again, lets the run go on
to the summary.
"""

from __future__ import annotations

from typing import Any

from service.core.modes.plan_execute.fixed import decide
from service.core.run.context import RunContext
from service.core.run.loop import Conversation
from service.core.tools.names import PLAN_VERIFY_TOOL
from service.core.tools.planning import (
    PLAN_VERIFY,
    RESULTS_HEADING,
    Plan,
    Verdict,
    parse_verdict,
)
from service.core.tools.registry import StageTools

VERIFY_INSTRUCTION = (
    f"Judge whether these results answer the request fully and correctly, with "
    f"{PLAN_VERIFY_TOOL}: verdict pass, or needsMorePlanning with the improvements needed."
)
VERIFY_REPAIR = f"You must give your verdict now: call {PLAN_VERIFY_TOOL}."


class Verifier:
    """The verify stage of one run."""

    def __init__(self, ctx: RunContext, plan: Plan) -> None:
        self.ctx = ctx
        self.plan = plan
        self.conversation: Conversation | None = None

    async def judge(self) -> Verdict | None:
        """The verdict on the plan's results so far (None: the verifier gave none)."""
        ctx = self.ctx
        brief = f"{RESULTS_HEADING}\n{self.plan.outline()}\n\n{VERIFY_INSTRUCTION}"
        if self.conversation is None:
            brief = f"The user's request:\n{ctx.command.message}\n\n{brief}"
            tools = StageTools.of((), [PLAN_VERIFY])
            stage = ctx.agent.stage("verify")
            self.conversation = Conversation.open(ctx, stage, brief, tools=tools, history=False)
        else:
            self.conversation.messages.append({"role": "user", "content": brief})
        return await decide(self.conversation, PLAN_VERIFY_TOOL, self._accept, VERIFY_REPAIR)

    @staticmethod
    def _accept(arguments: str) -> tuple[Verdict, Any]:
        return parse_verdict(arguments), "OK"
