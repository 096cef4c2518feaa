"""Chat memory: the last k runs of a chat, as the conversation given to the model.

From the stored steps of the last `k` runs (a sliding window counted in runs),
this builds valid OpenAI chat messages: the user's messages, the assistant's
answers, and its tool calls followed by their results. Reasoning is never sent
back. Assistant messages of one model response (sharing `_msgId`) are merged
back into one message; a tool call that never got a result (a cancelled run)
is dropped together with nothing else, so the order stays valid; extension
fields (`_msgId`, `ts`, ...) are removed, but for `_signatures`: what the answer's API
needs given back to continue after it (each provider keeps its own, the others drop them).

A run may have summarised the oldest turns of its memory (service/core/run/window.py):
its step record then carries `summary` — the text, and `through`, the newest run
it covers. Every run of the chat up to `through` is then given to the model as
that one summary message instead of its own messages; the window of `k` runs
counts the runs after it.
"""

from __future__ import annotations

from typing import Any

from service.core.model import SIGNATURES
from service.core.run.transcript import Message, PastRun, flatten, summary_run
from service.core.values import Record


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
    return flatten(remembered(records, k))


def remembered(records: list[Record], k: int) -> list[PastRun]:
    """The chat's memory by run: the latest summary, if any, then the last `k` runs after it."""
    summary = _latest_summary(records)
    if summary is not None:
        run_ids = [r.get("runId") for r in records]
        through = summary["through"]
        if through in run_ids:
            last = len(run_ids) - 1 - run_ids[::-1].index(through)
            records = records[last + 1 :]
    runs: list[PastRun] = []
    for record in last_runs(records, k):
        if record.get("_type") != "step":
            continue
        run_id = str(record.get("runId", ""))
        if not runs or runs[-1].run_id != run_id:
            runs.append(PastRun(run_id))
        runs[-1].messages.extend(_step_messages(record.get("messages") or []))
    runs = [run for run in runs if run.messages]
    if summary is not None:
        runs.insert(0, summary_run(summary["text"], summary["through"]))
    return runs


def _latest_summary(records: list[Record]) -> dict[str, str] | None:
    for record in reversed(records):
        summary = record.get("summary")
        if (
            isinstance(summary, dict)
            and isinstance(summary.get("text"), str)
            and isinstance(summary.get("through"), str)
        ):
            return {"text": summary["text"], "through": summary["through"]}
    return None


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
            if message.get(SIGNATURES):
                current.setdefault(SIGNATURES, []).extend(message[SIGNATURES])
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
