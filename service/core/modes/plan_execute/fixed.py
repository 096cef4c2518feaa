"""One decision of the model through a fixed planning tool (the replanner's, the verifier's).

The call is forced (`tool_choice=required`, reasoning off); only the first valid
call of the tool counts, every other call is refused with the reason. A turn
without a valid call gets one repair attempt; after it, no decision.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from service.core.run.executor import ToolOutcome
from service.core.run.loop import Conversation
from service.core.tools.planning import PlanningArgumentsError

T = TypeVar("T")

#: Takes a call's arguments; gives the decision and the call's result (refused: raises
#: `PlanningArgumentsError` with the reason).
Accept = Callable[[str], tuple[T, Any]]


async def decide(
    conversation: Conversation, tool_name: str, accept: Accept[T], repair: str
) -> T | None:
    """The decision of the model's call of `tool_name` (None: no valid call, even repaired)."""
    for attempt in range(2):
        turn = await conversation.ask(tool_choice="required", reasoning=False)
        decision: T | None = None
        outcomes: list[ToolOutcome] = []
        for call in turn.tool_calls:
            if call.name != tool_name:
                outcomes.append(conversation.refuse(call, f"only {tool_name} can be called here"))
            elif decision is not None:
                outcomes.append(conversation.refuse(call, f"{tool_name} was already called"))
            else:
                try:
                    decision, result = accept(call.arguments)
                except PlanningArgumentsError as error:
                    outcomes.append(conversation.refuse(call, f"invalid arguments: {error}"))
                else:
                    outcomes.append(conversation.reply(call, result))
        conversation.record(outcomes)
        if decision is not None:
            return decision
        if attempt == 0:
            conversation.messages.append({"role": "user", "content": repair})
    return None
