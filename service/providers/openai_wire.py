"""The OpenAI chat-completions wire format: request bodies, stream chunks, error bodies.

Pure functions, no I/O; `service/providers/openai.py` does the HTTP. Stream chunks
are decoded with orjson (about 3× faster than `json` on a typical chunk); a chunk
orjson rejects is retried with `json`, so nothing `json` accepts is refused.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Mapping
from typing import Any, Literal

import orjson

from service.core.errors import ProviderError, ProviderStreamError
from service.core.model import ModelDelta, ModelRequest, ToolCallDelta, Usage

__all__ = [
    "ReasoningStyle",
    "encode_body",
    "error_message",
    "parse_chunk",
    "request_body",
    "retry_after",
]

ReasoningStyle = Literal[
    "reasoning_effort", "enable_thinking", "chat_template_kwargs", "think", "none"
]
"""How a provider switches reasoning on (see `request_body`)."""


def request_body(
    request: ModelRequest, reasoning_style: ReasoningStyle, extra_body: Mapping[str, Any]
) -> dict[str, Any]:
    """The JSON body sent upstream for `request` (streaming, with usage, `extra_body` merged).

    The provider's `extra_body` is merged first, then the request's (the agent's `extraBody`).
    """
    body: dict[str, Any] = {
        "model": request.model,
        "messages": request.messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = request.tools
        if request.tool_choice is not None:
            body["tool_choice"] = request.tool_choice
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if request.max_tokens is not None:
        body["max_tokens"] = request.max_tokens
    on = request.reasoning.enabled
    if reasoning_style == "reasoning_effort":
        if on:
            body["reasoning_effort"] = request.reasoning.effort.lower()
    elif reasoning_style == "enable_thinking":
        body["enable_thinking"] = on
    elif reasoning_style == "chat_template_kwargs":
        body["chat_template_kwargs"] = {"enable_thinking": on}
    elif reasoning_style == "think":
        body["think"] = on
    _merge(body, extra_body)
    _merge(body, request.extra_body)
    return body


def encode_body(body: dict[str, Any]) -> bytes:
    """`body` as compact UTF-8 JSON."""
    try:
        return orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # e.g. an integer beyond 64 bits
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def parse_chunk(provider: str, data: str) -> ModelDelta | None:
    """One SSE data payload → one ModelDelta, or None when the chunk carries nothing."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            obj = json.loads(data)
        except ValueError:
            raise ProviderError(provider, f"invalid JSON in stream: {data[:200]!r}") from None
    if not isinstance(obj, dict):
        raise ProviderError(provider, f"unexpected stream payload: {data[:200]!r}")
    if obj.get("error"):
        err = obj["error"]
        msg = _message_of(obj) or str(err)[:500]
        code = err.get("code") if isinstance(err, dict) else None
        status = code if isinstance(code, int) else None
        raise ProviderStreamError(provider, f"stream error: {msg}", status=status)
    usage = _usage(obj.get("usage"))
    choices = obj.get("choices")
    if not choices:
        return None if usage is None else ModelDelta(usage=usage)
    choice = choices[0]
    delta = choice.get("delta") or {}
    content = delta.get("content") or None
    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or None
    if reasoning is not None and not isinstance(reasoning, str):
        reasoning = None
    finish = choice.get("finish_reason") or None
    tool_calls: tuple[ToolCallDelta, ...] = ()
    raw_calls = delta.get("tool_calls")
    if raw_calls:
        tool_calls = tuple(_tool_calls(raw_calls))
    if content is None and reasoning is None and not tool_calls and finish is None:
        return None if usage is None else ModelDelta(usage=usage)
    return ModelDelta(reasoning, content, tool_calls, finish, usage)


def error_message(raw: bytes) -> str:
    """The provider's message from an error body: `error.message`, else the text, truncated."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        msg = _message_of(json.loads(text))
    except ValueError:
        msg = ""
    if msg:
        return msg
    return (text[:500] + "…") if len(text) > 500 else (text or "(empty body)")


def retry_after(value: str | None) -> float | None:
    """Seconds to wait from a `Retry-After` header (seconds or an HTTP date), or None."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _tool_calls(raw: list[dict[str, Any]]) -> list[ToolCallDelta]:
    out: list[ToolCallDelta] = []
    for pos, call in enumerate(raw):
        fn = call.get("function") or {}
        index = call.get("index")
        tc = ToolCallDelta(
            index=index if isinstance(index, int) else pos,
            id=call.get("id") or None,
            name=fn.get("name") or None,
            arguments=fn.get("arguments") or "",
        )
        if tc.id or tc.name or tc.arguments:
            out.append(tc)
    return out


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    details = raw.get("completion_tokens_details") or {}
    prompt_details = raw.get("prompt_tokens_details") or {}
    prompt = raw.get("prompt_tokens") or 0
    completion = raw.get("completion_tokens") or 0
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=raw.get("total_tokens") or prompt + completion,
        reasoning_tokens=details.get("reasoning_tokens") or 0,
        cached_tokens=prompt_details.get("cached_tokens") or 0,
    )


def _message_of(obj: Any) -> str:
    """`error.message` (or `message`/`msg`/`detail`, or a string `error`) of a JSON error."""
    if not isinstance(obj, dict):
        return ""
    err = obj.get("error", obj)
    if isinstance(err, str):
        return err[:500]
    if isinstance(err, dict):
        for k in ("message", "msg", "detail"):
            if isinstance(err.get(k), str) and err[k]:
                return str(err[k])[:500]
    return ""


def _merge(into: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            into[k] = dict(into[k])
            _merge(into[k], v)
        else:
            into[k] = v
