"""What a model turn produced: its reasoning and content, its tool calls, its usage.

`stream_turn` (turn.py) returns a `TurnResult`; the modes act on it, the tool
executor runs its `ToolCall`s, and the run's turn observers (the chat recorder)
see it when the turn ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from service.core.model import Usage
from service.core.tools.definitions import ToolKind


@dataclass(slots=True)
class ToolCall:
    """A complete tool call of a turn."""

    id: str
    name: str
    arguments: str = ""
    upstream_id: str = ""
    kind: ToolKind = "backend"  # "frontend" and "action" calls carry their own ids
    chunks: int = 0  # argument fragments seen

    @property
    def ref(self) -> str:
        """The id the model knows the call by (its tool_call_id)."""
        return self.upstream_id or self.id


@dataclass(slots=True)
class TurnResult:
    """What one model turn produced."""

    msg_id: str
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = ""
    usage: Usage | None = None
    reasoning_id: str = ""
    content_id: str = ""
    first_delta_ms: float | None = None
    duration_ms: float = 0.0
    hidden_reasoning: str = ""  # reasoning collected but not streamed (emit_reasoning=False)
    task_id: str = ""  # the plan task the turn worked for, if any
    parent_tool_id: str = ""  # the subagent call whose nested run made the turn, if any
    # What the API needs given back with the turn to continue after it (thinking
    # signatures, thought signatures): kept with its assistant message, never shown.
    signatures: list[dict[str, Any]] = field(default_factory=list)
    cost: float = 0.0  # of the call, in the price table's currency, when priced

    def to_json(self) -> dict[str, Any]:
        """The turn as JSON data (a step's result in the run's journal), as `asdict` would
        give it; its lists are new, their JSON values shared (a turn is not changed once
        done, and its result is serialised at once)."""
        data = {name: getattr(self, name) for name in _TURN_FIELDS}
        data["tool_calls"] = [_fields_of(call, _CALL_FIELDS) for call in self.tool_calls]
        data["usage"] = _fields_of(self.usage, _USAGE_FIELDS) if self.usage is not None else None
        data["signatures"] = list(self.signatures)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TurnResult:
        fields = dict(data)
        fields["tool_calls"] = [ToolCall(**call) for call in fields.get("tool_calls", [])]
        usage = fields.get("usage")
        fields["usage"] = Usage(**usage) if usage is not None else None
        return cls(**fields)


def _fields_of(value: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(value, name) for name in names}


_TURN_FIELDS = tuple(TurnResult.__dataclass_fields__)
_CALL_FIELDS = tuple(ToolCall.__dataclass_fields__)
_USAGE_FIELDS = tuple(Usage.__dataclass_fields__)
