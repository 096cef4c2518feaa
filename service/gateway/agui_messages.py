"""An AG-UI thread's messages, from its agw chat's history: `MESSAGES_SNAPSHOT`.

When a query continues a thread that has earlier runs, the AG-UI run begins (right after
`RUN_STARTED`) with a `MESSAGES_SNAPSHOT`: the conversation as agw keeps it, so a client
that reopens the thread with only its new message (a reloaded page, another device) gets
the whole of it, with the ids the live stream used. From `GetChat`'s events, each run's:

- `request.query` → a `user` message (its id: the query's `requestId`; the endpoint sends
  the AG-UI message's id as the request id, so a client's own messages keep their ids);
- `reasoning.snapshot` → a `reasoning` message, `content.snapshot` → an `assistant` one
  (their ids: the block ids, as `REASONING_MESSAGE_START` and `TEXT_MESSAGE_START` say);
- `tool.snapshot`, `action.snapshot` → an `assistant` message with the call in
  `toolCalls` (its id: the call's, as `TOOL_CALL_START` makes it);
- `tool.result`, `action.result` → a `tool` message (`{toolId}_result`).

A subagent's nested events stay out (they are its own conversation), and the snapshot
ends with the input's new user message, as the client sent it: a snapshot replaces the
client's messages, so it must hold the one being answered.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agw.v1 import events_pb2 as pb

from service.gateway.agui_events import result_text

Message = dict[str, Any]


def thread_messages(events: Iterable[pb.Event]) -> list[Message]:
    """The AG-UI messages of a chat's history (its events in snapshot form)."""
    messages: list[Message] = []
    for event in events:
        if event.parent_tool_id:
            continue
        kind = event.WhichOneof("payload")
        if kind == "request_query":
            query = event.request_query
            messages.append({"id": query.request_id, "role": "user", "content": query.message})
        elif kind == "reasoning_snapshot":
            thought = event.reasoning_snapshot
            messages.append(
                {"id": thought.reasoning_id, "role": "reasoning", "content": thought.text}
            )
        elif kind == "content_snapshot":
            text = event.content_snapshot
            messages.append({"id": text.content_id, "role": "assistant", "content": text.text})
        elif kind == "tool_snapshot":
            call = event.tool_snapshot
            messages.append(_call(call.tool_id, call.tool_name, call.arguments))
        elif kind == "action_snapshot":
            action = event.action_snapshot
            messages.append(_call(action.action_id, action.action_name, action.arguments))
        elif kind in ("tool_result", "action_result"):
            result = getattr(event, kind)
            call_id = result.tool_id if kind == "tool_result" else result.action_id
            messages.append(
                {
                    "id": f"{call_id}_result",
                    "role": "tool",
                    "toolCallId": call_id,
                    "content": result_text(result.result),
                }
            )
    return messages


def _call(call_id: str, name: str, arguments: str) -> Message:
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"id": call_id, "role": "assistant", "toolCalls": [call]}
