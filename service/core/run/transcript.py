"""The conversation the model is given: messages, the chat's earlier runs, their size.

A run is given its chat's memory (service/core/chats/memory.py) as `PastRun`s: the
messages each earlier run left, oldest first, a summary of older ones being a past
run of its own. The context window (window.py) measures them with `estimate_tokens` (by
script: tokens.py)
and summarises or trims them by whole past runs, so a tool call never loses its result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from service.core.run.tokens import MAX_RATE, text_tokens

Message = dict[str, Any]

SUMMARY_HEADING = "[Summary of the earlier conversation]"


@dataclass(slots=True)
class PastRun:
    """The messages one earlier run of the chat left in memory; a summary is one of its own."""

    run_id: str  # "" for a summary
    messages: list[Message] = field(default_factory=list)
    through: str = ""  # a summary: the newest run it covers


def summary_message(text: str) -> Message:
    """The message a summary of earlier turns is given to the model as."""
    return {"role": "user", "content": f"{SUMMARY_HEADING}\n{text}"}


def summary_run(text: str, through: str) -> PastRun:
    return PastRun("", [summary_message(text)], through)


def flatten(runs: list[PastRun]) -> list[Message]:
    return [message for run in runs for message in run.messages]


def estimate_tokens(messages: list[Message]) -> int:
    """The prompt's tokens, estimated by script (`tokens.text_tokens`), plus 4 a message for
    its role and framing: enough to keep within a budget."""
    return round(
        sum(
            text_tokens(_text(m.get("content"))) + text_tokens(_text(m.get("tool_calls"))) + 4
            for m in messages
        )
    )


def tokens_at_most(messages: list[Message]) -> float:
    """A bound of `estimate_tokens(messages)` made from lengths only (no text is read)."""
    chars = sum(len(_text(m.get("content"))) + len(_text(m.get("tool_calls"))) for m in messages)
    return chars * MAX_RATE + 4 * len(messages) + 0.5  # (+ 0.5: the estimate is rounded)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value) if value else ""
