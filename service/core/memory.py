"""Chat memory: the last k runs of a chat, as the conversation given to the model.

From the stored steps of the last `k` runs (a sliding window counted in runs),
this builds valid OpenAI chat messages: the user's messages, the assistant's
answers, and its tool calls followed by their results. Reasoning is never sent
back. Assistant messages of one model response (sharing `_msgId`) are merged
back into one message; a tool call that never got a result (a cancelled run)
is dropped together with nothing else, so the order stays valid; extension
fields (`_msgId`, `ts`, ...) are removed.
"""

from __future__ import annotations

from typing import Any

from service.core.ports import Record

Message = dict[str, Any]


def last_runs(records: list[Record], k: int) -> list[Record]:
    """The records of the last `k` runs, in order."""
    run_ids: list[str] = []
    for record in records:
        run_id = record.get("runId")
        if isinstance(run_id, str) and run_id not in run_ids:
            run_ids.append(run_id)
    keep = set(run_ids[-k:]) if k > 0 else set()
    return [r for r in records if r.get("runId") in keep]


def _content(parts: Any) -> Any:
    """Text parts become one string (accepted by every provider); other parts stay a list."""
    if not isinstance(parts, list):
        return parts
    if all(isinstance(p, dict) and p.get("type") == "text" for p in parts):
        return "".join(str(p.get("text", "")) for p in parts)
    return parts


def conversation(records: list[Record], k: int) -> list[Message]:
    """The messages of the last `k` runs, ready to follow the system prompt."""
    out: list[Message] = []
    for record in last_runs(records, k):
        if record.get("_type") != "step":
            continue
        out.extend(_step_messages(record.get("messages") or []))
    return out


def _step_messages(messages: list[Record]) -> list[Message]:
    answered = {m.get("tool_call_id") for m in messages if m.get("role") == "tool"}
    out: list[Message] = []
    current: Message | None = None  # the assistant message being merged
    current_msg_id: object = None
    for message in messages:
        role = message.get("role")
        if role == "assistant" and "reasoning_content" in message:
            continue
        if role == "assistant":
            calls = [c for c in message.get("tool_calls") or [] if c.get("id") in answered]
            if message.get("tool_calls") and not calls:
                continue
            msg_id = message.get("_msgId")
            if current is None or msg_id is None or msg_id != current_msg_id:
                current = {"role": "assistant", "content": None}
                current_msg_id = msg_id
                out.append(current)
            if "content" in message:
                text = _content(message["content"])
                if text:
                    current["content"] = (current["content"] or "") + text
            if calls:
                current.setdefault("tool_calls", []).extend(
                    {"id": c["id"], "type": "function", "function": dict(c["function"])}
                    for c in calls
                )
            continue
        current = None
        if role == "tool":
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": message.get("tool_call_id"),
                    "content": _content(message.get("content")) or "",
                }
            )
        elif role in ("user", "system"):
            out.append({"role": role, "content": _content(message.get("content"))})
    return [m for m in out if m["role"] != "assistant" or m.get("content") or m.get("tool_calls")]


def estimate_tokens(messages: list[Message]) -> int:
    """A rough token count (4 characters a token), enough to keep within a budget."""
    return (
        sum(
            len(str(m.get("content") or "")) + len(str(m.get("tool_calls") or "")) + 16
            for m in messages
        )
        // 4
    )


def fit(history: list[Message], max_tokens: int) -> list[Message]:
    """The newest whole turns of `history` that fit `max_tokens` (a turn starts at a user message).

    Whole turns are dropped from the oldest on, so a tool call is never separated
    from its result and the conversation stays valid.
    """
    if max_tokens <= 0 or estimate_tokens(history) <= max_tokens:
        return history
    starts = [i for i, m in enumerate(history) if m.get("role") == "user"]
    for start in starts:
        kept = history[start:]
        if estimate_tokens(kept) <= max_tokens:
            return kept
    return []
