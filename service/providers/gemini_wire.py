"""Google's Gemini API wire: `streamGenerateContent` with SSE (`alt=sse`).

Pure functions and a per-stream decoder, no I/O; `service.providers.http` does the HTTP.

*Requests.* The core's OpenAI-style conversation is converted: system messages become
`systemInstruction`, the assistant is the `model` role, its tool calls `functionCall`
parts (arguments parsed), tool results `functionResponse` parts of a user turn (named
after the call they answer), consecutive turns of one role are merged. The thought
signatures an earlier answer streamed are given back on the parts they came with, from
the assistant message's `_signatures`; a function call without one (an answer from
another API) gets the placeholder the API documents for conversations it did not
write. Tools are declared with their JSON Schema (`parametersJsonSchema`); reasoning on
asks for thoughts (`includeThoughts`) with a budget by effort.

*Stream.* Each event is a whole `GenerateContentResponse` and gives at most one delta:
its candidate's thought parts as reasoning, its text parts as content, its
`functionCall` parts as whole tool calls (parallel calls in one event come as one
delta; a call without an id gets one made of the response id), the thought signatures
with them. The finish reason (STOP with calls is `tool_calls`; the safety family is
`content_filter`) comes with the usage of the last event. A prompt the API blocked
(`promptFeedback.blockReason`, no candidate) fails the call, naming the reason.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from service.core.errors import ProviderError
from service.core.model import SIGNATURES, ModelDelta, ModelRequest, ToolCallDelta, Usage
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

__all__ = ["GeminiStream", "GeminiWire", "PromptBlocked", "request_body"]

API = "gemini"  # the `api` of the signatures this wire keeps
#: The thought signature of a function call the API did not write (from another API):
#: the placeholder Gemini's documentation gives for such conversations.
FOREIGN_CALL_SIGNATURE = "skip_thought_signature_validator"

#: Thinking budget (tokens) by reasoning effort.
BUDGETS = {"LOW": 1024, "MEDIUM": 8192, "HIGH": 24576}

FILTERED = frozenset(
    {"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY", "LANGUAGE"}
)
FINISH = {"STOP": "stop", "MAX_TOKENS": "length"}


class PromptBlocked(ProviderError):
    """The API refused the prompt itself (its reason: PROVIDER_ERROR): another model of
    an alias would not be asked it."""


class GeminiWire:
    """The Gemini API wire (`service.providers.http.Wire`)."""

    done_data: str | None = None

    def __init__(self, extra_body: Mapping[str, Any]) -> None:
        self.extra_body = extra_body

    def url(self, base_url: str, request: ModelRequest) -> str:
        return f"{base_url}/models/{quote(request.model, safe='')}:streamGenerateContent?alt=sse"

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"x-goog-api-key": api_key}

    def body(self, request: ModelRequest) -> dict[str, Any]:
        return request_body(request, self.extra_body)

    def decoder(self, provider: str, scrub: Callable[[str], str]) -> GeminiStream:
        return GeminiStream(provider, scrub)


def request_body(request: ModelRequest, extra_body: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body of a streaming call of `request` (`extra_body` merged last)."""
    system, contents = _conversation(request.messages)
    body: dict[str, Any] = {"contents": contents}
    if system:
        body["systemInstruction"] = {"parts": [{"text": "\n\n".join(system)}]}
    if request.tools:
        declarations = [_declaration(t) for t in request.tools]
        body["tools"] = [{"functionDeclarations": declarations}]
        config = _calling_config(request.tool_choice)
        if config is not None:
            body["toolConfig"] = {"functionCallingConfig": config}
    generation = sampling(request, top_p="topP", max_tokens="maxOutputTokens")
    if request.reasoning.enabled:
        budget = BUDGETS[request.reasoning.effort]
        generation["thinkingConfig"] = {"includeThoughts": True, "thinkingBudget": budget}
    if generation:
        body["generationConfig"] = generation
    merge(body, extra_body)
    merge(body, request.extra_body)
    return body


def _conversation(messages: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """(system texts, contents) of OpenAI-style `messages`."""
    system: list[str] = []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool call id -> function name, for the responses
    for message in messages:
        role = message.get("role")
        if role == "system":
            text = _text(message.get("content"))
            if text:
                system.append(text)
        elif role == "user":
            append_turn(contents, "user", _user_parts(message.get("content")), "parts")
        elif role == "assistant":
            append_turn(contents, "model", _model_parts(message, names), "parts")
        elif role == "tool":
            call_id = str(message.get("tool_call_id") or "")
            response = {
                "id": call_id,
                "name": names.get(call_id, ""),
                "response": _response(_text(message.get("content"))),
            }
            append_turn(contents, "user", [{"functionResponse": response}], "parts")
    return system, contents


def _model_parts(message: dict[str, Any], names: dict[str, str]) -> list[dict[str, Any]]:
    kept = [s for s in message.get(SIGNATURES) or () if s.get("api") == API]
    by_call = {s["call"]: s["signature"] for s in kept if "call" in s}
    on_text = [s["signature"] for s in kept if "call" not in s]
    parts: list[dict[str, Any]] = []
    text = _text(message.get("content"))
    if text or on_text:
        part: dict[str, Any] = {"text": text}
        if on_text:
            part["thoughtSignature"] = on_text[0]
        parts.append(part)
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        call_id = str(call.get("id") or "")
        name = str(function.get("name") or "")
        names[call_id] = name
        parts.append(
            {
                "functionCall": {
                    "id": call_id,
                    "name": name,
                    "args": _args(function.get("arguments")),
                },
                "thoughtSignature": by_call.get(call_id, FOREIGN_CALL_SIGNATURE),
            }
        )
    return parts


def _args(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {"arguments": raw}
    return value if isinstance(value, dict) else {"value": value}


def _response(text: str) -> dict[str, Any]:
    """A tool result as the object a `functionResponse` carries."""
    try:
        value = json.loads(text)
    except ValueError:
        value = text
    return value if isinstance(value, dict) else {"result": value}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _user_parts(content: Any) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        text = _text(content)
        return [{"text": text}] if text else []
    parts: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "image_url":
            url = str((part.get("image_url") or {}).get("url", ""))
            if url.startswith("data:") and ";base64," in url:
                mime, _, data = url[5:].partition(";base64,")
                parts.append({"inlineData": {"mimeType": mime, "data": data}})
            else:
                parts.append({"fileData": {"fileUri": url}})
        elif part.get("type") == "text":
            parts.append({"text": str(part.get("text", ""))})
    return parts


def _declaration(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function") or {}
    out: dict[str, Any] = {"name": function.get("name", "")}
    if function.get("description"):
        out["description"] = function["description"]
    if function.get("parameters"):
        out["parametersJsonSchema"] = function["parameters"]
    return out


MODES = {"auto": "AUTO", "none": "NONE", "required": "ANY"}


def _calling_config(choice: Any) -> dict[str, Any] | None:
    if isinstance(choice, str) and choice in MODES:
        return {"mode": MODES[choice]}
    name = named_tool(choice)
    return {"mode": "ANY", "allowedFunctionNames": [name]} if name else None


class GeminiStream:
    """The decoder of one Gemini stream: one event's data → at most one delta."""

    __slots__ = ("_calls", "provider", "scrub")

    def __init__(self, provider: str, scrub: Callable[[str], str] = str) -> None:
        self.provider = provider
        self.scrub = scrub
        self._calls = 0  # function calls so far in the turn

    def __call__(self, data: str) -> ModelDelta | None:
        event = load_object(self.provider, data, self.scrub)
        if event.get("error"):
            stream_error(self.provider, event, self.scrub)
        try:
            return self._response(event)
        except Malformed as exc:
            raise ProviderError(self.provider, f"malformed stream event: {exc}") from None

    def _response(self, event: dict[str, Any]) -> ModelDelta | None:
        candidates = event.get("candidates")
        if not candidates:
            feedback = event.get("promptFeedback")
            if isinstance(feedback, dict) and feedback.get("blockReason"):
                reason = str(feedback["blockReason"])
                why = feedback.get("blockReasonMessage")
                detail = f"{reason}: {self.scrub(str(why))}" if why else reason
                raise PromptBlocked(self.provider, f"the prompt was blocked ({detail})")
            return None
        if not isinstance(candidates, list) or not isinstance(candidates[0], dict):
            raise Malformed("candidates", candidates, "a list of objects")
        candidate = next((c for c in candidates if c.get("index", 0) == 0), candidates[0])
        content = object_field(candidate, "content", "candidates[0]")
        parts = content.get("parts") or []
        if not isinstance(parts, list):
            raise Malformed("candidates[0].content.parts", parts, "a list")
        reasoning: list[str] = []
        text: list[str] = []
        calls: list[ToolCallDelta] = []
        kept: list[dict[str, Any]] = []
        for pos, part in enumerate(parts):
            if not isinstance(part, dict):
                raise Malformed(f"candidates[0].content.parts[{pos}]", part, "an object")
            signature = part.get("thoughtSignature")
            call = part.get("functionCall")
            if call is not None:
                calls.append(self._call(call, event, pos))
                if signature:
                    kept.append({"api": API, "call": calls[-1].id, "signature": signature})
                continue
            value = string_field(part, "text", f"candidates[0].content.parts[{pos}]")
            if value:
                (reasoning if part.get("thought") else text).append(value)
            if signature:
                kept.append({"api": API, "signature": signature})
        finish = self._finish(candidate.get("finishReason"))
        usage = _usage(event.get("usageMetadata")) if finish else None
        if not (reasoning or text or calls or kept or finish):
            return None
        return ModelDelta(
            reasoning="".join(reasoning) or None,
            content="".join(text) or None,
            tool_calls=tuple(calls),
            finish_reason=finish,
            usage=usage,
            signatures=tuple(kept),
        )

    def _call(self, call: Any, event: dict[str, Any], pos: int) -> ToolCallDelta:
        where = f"candidates[0].content.parts[{pos}].functionCall"
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise Malformed(f"{where}.name", call, "a string")
        index = self._calls
        self._calls += 1
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            response = event.get("responseId")
            stem = response if isinstance(response, str) and response else secrets.token_hex(8)
            call_id = f"call_{stem}_{index}"
        args = call.get("args")
        arguments = json.dumps(args if args is not None else {}, ensure_ascii=False)
        return ToolCallDelta(index, call_id, call["name"], arguments)

    def _finish(self, reason: Any) -> str | None:
        if not reason or reason == "FINISH_REASON_UNSPECIFIED":
            return None
        if not isinstance(reason, str):
            raise Malformed("candidates[0].finishReason", reason, "a string")
        if reason == "STOP" and self._calls:
            return "tool_calls"
        if reason in FILTERED:
            return "content_filter"
        return FINISH.get(reason, reason.lower())


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    where = "usageMetadata"
    prompt = count(raw, "promptTokenCount", where)
    answer = count(raw, "candidatesTokenCount", where)
    thoughts = count(raw, "thoughtsTokenCount", where)
    total = count(raw, "totalTokenCount", where) or prompt + answer + thoughts
    cached = count(raw, "cachedContentTokenCount", where)
    return Usage(prompt, answer + thoughts, total, thoughts, cached)
