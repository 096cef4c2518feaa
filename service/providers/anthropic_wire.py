"""Anthropic's Messages API wire: request bodies from the port's requests, stream events.

Pure functions and a per-stream decoder, no I/O; `service.providers.http` does the HTTP.

*Requests.* The conversation stays in OpenAI's form in the core (service/core/model.py);
`request_body` converts it: system messages become `system`, tool results become
`tool_result` blocks of a user message, consecutive messages of one role are merged,
tool calls become `tool_use` blocks with their arguments parsed. The thinking blocks an
earlier answer streamed are given back from the assistant message's `_signatures`
(with their signatures; redacted ones with their data), which the API requires when a
thinking model continues after a tool call. `cache_control` on a text part (prompt
caching) is passed through. Reasoning on is `thinking` with a budget by effort; the API
refuses a temperature or a forced tool choice with it, so those turn it off, as does a
conversation continuing after tool calls that no thinking block precedes (an answer
from another API).

*Stream.* One event gives at most one delta, at once: `text_delta` → content,
`thinking_delta` → reasoning, `tool_use` start → the call's id and name,
`input_json_delta` → a fragment of its arguments; a thinking block's end gives its
text and signature to keep (no event), a redacted one its data; `message_delta` gives
the finish reason and the usage (input counted with the cache's reads and writes);
`message_stop` ends the stream; `ping` is nothing; an `error` event fails the call.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from service.core.errors import ProviderError
from service.core.model import SIGNATURES, ModelDelta, ModelRequest, ToolCallDelta, Usage
from service.providers.http import END
from service.providers.openai_wire import (
    Malformed,
    append_turn,
    count,
    load_object,
    merge,
    named_tool,
    object_field,
    sampling,
    stream_error,
    string_field,
)

__all__ = ["ANTHROPIC_VERSION", "AnthropicStream", "AnthropicWire", "request_body"]

ANTHROPIC_VERSION = "2023-06-01"
API = "anthropic"  # the `api` of the signatures this wire keeps

#: Thinking budget (tokens) by reasoning effort.
BUDGETS = {"LOW": 1024, "MEDIUM": 4096, "HIGH": 16384}
MIN_BUDGET = 1024  # the API's smallest thinking budget

FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "model_context_window_exceeded": "length",
}


class AnthropicWire:
    """The Messages API wire (`service.providers.http.Wire`)."""

    done_data: str | None = None

    def __init__(self, max_tokens: int, extra_body: Mapping[str, Any]) -> None:
        self.max_tokens = max_tokens
        self.extra_body = extra_body

    def url(self, base_url: str, request: ModelRequest) -> str:
        return base_url + "/messages"

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"x-api-key": api_key, "anthropic-version": ANTHROPIC_VERSION}

    def body(self, request: ModelRequest) -> dict[str, Any]:
        return request_body(request, self.max_tokens, self.extra_body)

    def decoder(self, provider: str, scrub: Callable[[str], str]) -> AnthropicStream:
        return AnthropicStream(provider, scrub)


def request_body(
    request: ModelRequest, default_max_tokens: int, extra_body: Mapping[str, Any]
) -> dict[str, Any]:
    """The JSON body of a streaming Messages call of `request` (`extra_body` merged last)."""
    system, messages = _conversation(request.messages)
    body: dict[str, Any] = {"model": request.model, "messages": messages, "stream": True}
    if system:
        body["system"] = system
    max_tokens = request.max_tokens or default_max_tokens
    choice = _tool_choice(request.tool_choice) if request.tools else None
    if request.tools:
        body["tools"] = [_tool(t) for t in request.tools]
        if choice is not None:
            body["tool_choice"] = choice
    thinking = request.reasoning.enabled and _may_think(messages, choice)
    if thinking:
        budget = max(MIN_BUDGET, min(BUDGETS[request.reasoning.effort], max_tokens - 1))
        max_tokens = max(max_tokens, budget + 1)
        body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    else:  # the API refuses a temperature (and most top_p) with thinking
        body.update(sampling(request))  # its max_tokens is set below
    body["max_tokens"] = max_tokens
    merge(body, extra_body)
    merge(body, request.extra_body)
    return body


def _may_think(messages: list[dict[str, Any]], choice: dict[str, Any] | None) -> bool:
    """Whether thinking may be on: not with a forced tool choice, and not when the
    conversation goes on after tool calls whose answer starts without a thinking block."""
    if choice is not None and choice["type"] in ("any", "tool"):
        return False
    for message in reversed(messages):
        if message["role"] != "assistant":
            continue
        blocks = message["content"]
        if any(b.get("type") == "tool_use" for b in blocks):
            return blocks[0].get("type") in ("thinking", "redacted_thinking")
        return True
    return True


def _conversation(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Any]]:
    """(system blocks, messages) of OpenAI-style `messages`."""
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "system":
            system += _text_blocks(message.get("content"))
        elif role == "user":
            append_turn(out, "user", _user_blocks(message.get("content")), "content")
        elif role == "assistant":
            append_turn(out, "assistant", _assistant_blocks(message), "content")
        elif role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id") or "",
                "content": _text_blocks(message.get("content")) or [{"type": "text", "text": ""}],
            }
            append_turn(out, "user", [result], "content")
    return system, out


def _assistant_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    blocks = [
        {k: v for k, v in item.items() if k != "api"}
        for item in message.get(SIGNATURES) or ()
        if item.get("api") == API
    ]
    blocks += _text_blocks(message.get("content"))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id") or "",
                "name": function.get("name") or "",
                "input": _arguments(function.get("arguments")),
            }
        )
    return blocks


def _arguments(raw: Any) -> Any:
    """A tool call's arguments as the object the API wants (its JSON text parsed)."""
    if not isinstance(raw, str):
        return raw if isinstance(raw, dict) else {}
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        return {"arguments": raw}  # not JSON: kept as the model wrote it
    return value if isinstance(value, dict) else {"value": value}


def _text_blocks(content: Any) -> list[dict[str, Any]]:
    """Text blocks of a message's content (a string or OpenAI text parts)."""
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    blocks = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            block = {"type": "text", "text": str(part.get("text", ""))}
            if "cache_control" in part:
                block["cache_control"] = part["cache_control"]
            blocks.append(block)
    return blocks


def _user_blocks(content: Any) -> list[dict[str, Any]]:
    """A user message's blocks: its text, and its images (data URLs or URLs)."""
    if not isinstance(content, list):
        return _text_blocks(content)
    blocks = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "image_url":
            url = str((part.get("image_url") or {}).get("url", ""))
            blocks.append({"type": "image", "source": _image_source(url)})
        else:
            blocks += _text_blocks([part])
    return blocks


def _image_source(url: str) -> dict[str, str]:
    if url.startswith("data:") and ";base64," in url:
        media_type, _, data = url[5:].partition(";base64,")
        return {"type": "base64", "media_type": media_type, "data": data}
    return {"type": "url", "url": url}


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function") or {}
    out: dict[str, Any] = {
        "name": function.get("name", ""),
        "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
    }
    if function.get("description"):
        out["description"] = function["description"]
    return out


CHOICES = {"auto": {"type": "auto"}, "none": {"type": "none"}, "required": {"type": "any"}}


def _tool_choice(choice: Any) -> dict[str, Any] | None:
    if isinstance(choice, str) and choice in CHOICES:
        return dict(CHOICES[choice])
    name = named_tool(choice)
    return {"type": "tool", "name": name} if name else None


class AnthropicStream:
    """The decoder of one Messages stream: one event's data → at most one delta."""

    __slots__ = ("_calls", "_input", "_signature", "_thinking", "provider", "scrub")

    def __init__(self, provider: str, scrub: Callable[[str], str] = str) -> None:
        self.provider = provider
        self.scrub = scrub
        self._calls: dict[int, int] = {}  # block index -> tool call index in the turn
        self._thinking: dict[int, list[str]] = {}  # block index -> its text so far
        self._signature: dict[int, list[str]] = {}  # block index -> its signature so far
        self._input: dict[str, Any] = {}  # message_start's usage

    def __call__(self, data: str) -> ModelDelta | None:
        event = load_object(self.provider, data, self.scrub)
        kind = event.get("type")
        try:
            if kind == "content_block_delta":
                return self._delta(event)
            if kind == "content_block_start":
                return self._start(event)
            if kind == "content_block_stop":
                return self._stop(_index(event))
            if kind == "message_delta":
                return self._message_delta(event)
            if kind == "message_start":
                message = object_field(event, "message")
                self._input = object_field(message, "usage", "message")
                return None
            if kind == "message_stop":
                return END
            if kind == "error":
                stream_error(self.provider, event, self.scrub)
        except Malformed as exc:
            raise ProviderError(self.provider, f"malformed stream event: {exc}") from None
        return None  # ping, and events of features this wire does not use

    def _delta(self, event: dict[str, Any]) -> ModelDelta | None:
        index = _index(event)
        delta = object_field(event, "delta")
        kind = delta.get("type")
        if kind == "text_delta":
            text = string_field(delta, "text", "delta")
            return ModelDelta(content=text) if text else None
        if kind == "thinking_delta":
            text = string_field(delta, "thinking", "delta")
            if not text:
                return None
            self._thinking.setdefault(index, []).append(text)
            return ModelDelta(reasoning=text)
        if kind == "input_json_delta":
            fragment = string_field(delta, "partial_json", "delta")
            call = self._calls.get(index)
            if call is None:
                raise Malformed(f"input_json_delta's block {index}", "", "a tool_use block")
            return (
                ModelDelta(tool_calls=(ToolCallDelta(call, arguments=fragment),))
                if fragment
                else None
            )
        if kind == "signature_delta":
            self._signature.setdefault(index, []).append(string_field(delta, "signature", "delta"))
        return None  # citations, and a signature (given whole when its block ends)

    def _start(self, event: dict[str, Any]) -> ModelDelta | None:
        index = _index(event)
        block = object_field(event, "content_block")
        kind = block.get("type")
        if kind == "tool_use":
            call = self._calls[index] = len(self._calls)
            call_id = string_field(block, "id", "content_block")
            name = string_field(block, "name", "content_block")
            return ModelDelta(tool_calls=(ToolCallDelta(call, call_id or None, name or None),))
        if kind == "text":
            text = string_field(block, "text", "content_block")
            return ModelDelta(content=text) if text else None
        if kind == "thinking":
            text = string_field(block, "thinking", "content_block")
            self._thinking[index] = [text]
            return ModelDelta(reasoning=text) if text else None
        if kind == "redacted_thinking":
            data = string_field(block, "data", "content_block")
            return ModelDelta(signatures=({"api": API, "type": "redacted_thinking", "data": data},))
        return None  # server tools and their results: not relayed

    def _stop(self, index: int) -> ModelDelta | None:
        signature = self._signature.pop(index, None)
        text = self._thinking.pop(index, None)
        if signature is None:
            return None
        item = {
            "api": API,
            "type": "thinking",
            "thinking": "".join(text or ()),
            "signature": "".join(signature),
        }
        return ModelDelta(signatures=(item,))

    def _message_delta(self, event: dict[str, Any]) -> ModelDelta:
        delta = object_field(event, "delta")
        stop = string_field(delta, "stop_reason", "delta")
        usage = object_field(event, "usage")
        return ModelDelta(
            finish_reason=FINISH.get(stop, stop) if stop else None, usage=self._usage(usage)
        )

    def _usage(self, final: dict[str, Any]) -> Usage:
        """The call's usage: message_start's counts, updated by message_delta's."""
        counts = {**self._input, **{k: v for k, v in final.items() if v is not None}}
        fresh = count(counts, "input_tokens", "usage")
        written = count(counts, "cache_creation_input_tokens", "usage")
        read = count(counts, "cache_read_input_tokens", "usage")
        output = count(counts, "output_tokens", "usage")
        details = object_field(counts, "output_tokens_details", "usage")
        thinking = count(details, "thinking_tokens", "usage.output_tokens_details")
        prompt = fresh + written + read
        return Usage(prompt, output, prompt + output, thinking, read)


def _index(event: dict[str, Any]) -> int:
    index = event.get("index")
    if type(index) is not int or index < 0:
        raise Malformed("index", index, "a non-negative integer")
    return index
