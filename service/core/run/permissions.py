"""The agent's permission policy for tool calls: ALLOW, DENY, or ASK the user.

An ASK call emits `permission.ask` with a `perm_` id and waits (like a frontend
tool) for `Submit(toolId = that id)`; the payload `true`/`false`,
`{"allowed": bool}` or a word ("allow", "yes", "deny", "no") decides, and
`permission.answer` records the decision. No answer in time is a refusal.
"""

from __future__ import annotations

from typing import Any

from service.core import events
from service.core.run.eventlog import Emitter
from service.core.run.results import ToolCall
from service.core.run.waits import Waits, WaitTimedOut
from service.core.tools.definitions import ToolError

YES = frozenset({"allow", "allowed", "yes", "y", "ok", "approve", "true"})


def allowed(payload: Any) -> bool:
    """Whether a Submit payload grants the permission."""
    if isinstance(payload, dict):
        payload = payload.get("allowed", payload.get("approved", False))
    if isinstance(payload, str):
        return payload.strip().lower() in YES
    return payload is True


async def check(out: Emitter, waits: Waits, call: ToolCall, permission: str) -> None:
    """Return when `call` may run; raise ToolError (fed back to the model) when not."""
    if permission == "ALLOW":
        return
    if permission == "DENY":
        raise ToolError(f"'{call.name}' is not permitted for this agent")
    permission_id = out.token("perm_")
    out.emit(
        events.make(
            "permission_ask",
            permission_id=permission_id,
            tool_id=call.id,
            tool_name=call.name,
            arguments=call.arguments,
            timeout_ms=round(waits.timeout_s * 1000),
        )
    )
    try:
        granted, reason = (
            allowed(await waits.wait(out, permission_id, call.name, kind="permission")),
            "user",
        )
    except WaitTimedOut:
        granted, reason = False, "timeout"
    out.emit(
        events.make(
            "permission_answer", permission_id=permission_id, allowed=granted, reason=reason
        )
    )
    if not granted:
        why = "did not answer in time" if reason == "timeout" else "refused"
        raise ToolError(f"the user {why}: '{call.name}' was not run")
