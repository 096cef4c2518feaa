"""The OpenAI chat-completions wire format: request bodies, stream chunks, error bodies.

Pure functions, no I/O; `service/providers/http.py` does the HTTP. The helpers reading
a stream event's fields (`load_object`, `object_field`, `string_field`, `count`,
`Malformed`, `stream_error`) serve the other APIs' wires too. Stream chunks
are decoded with orjson (about 3× faster than `json` on a typical chunk); a chunk
orjson rejects is retried with `json`, so nothing `json` accepts is refused
(unpaired surrogate escapes, which orjson rejects, become U+FFFD).

Every field read from a chunk is type-checked: a chunk of the wrong shape is a
`ProviderError` naming the field, never a crash. Only the choice with index 0
is relayed: a provider asked for several choices (`"n": 2` in `extra_body`)
streams them interleaved, and the others are ignored.
"""

from __future__ import annotations

import email.utils
import functools
import json
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, NoReturn

import orjson

from service.core.errors import ProviderError, ProviderStreamError
from service.core.model import SIGNATURES, ModelDelta, ModelRequest, ToolCallDelta, Usage

__all__ = [
    "Malformed",
    "OpenAIWire",
    "ReasoningStyle",
    "append_turn",
    "count",
    "encode_body",
    "error_code",
    "error_message",
    "load_object",
    "merge",
    "message_of",
    "named_tool",
    "object_field",
    "parse_chunk",
    "plain_messages",
    "request_body",
    "retry_after",
    "sampling",
    "stream_error",
    "string_field",
]

_MAX_MESSAGE = 500  # characters of a provider's error message quoted in ours
_MAX_QUOTED = 200  # characters of a bad stream payload quoted in an error message
_MAX_INDEX = 2**31 - 1
_INDEX_RANGE = f"an integer from 0 to {_MAX_INDEX}"
_MAX_COUNT = 2**53  # token counts are summed over a run's calls in an int64
_SURROGATE = re.compile("[\ud800-\udfff]")

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
        "messages": plain_messages(request.messages),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = request.tools
        if request.tool_choice is not None:
            body["tool_choice"] = request.tool_choice
    body.update(sampling(request))
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
    merge(body, extra_body)
    merge(body, request.extra_body)
    return body


def sampling(
    request: ModelRequest,
    temperature: str = "temperature",
    top_p: str = "top_p",
    max_tokens: str = "max_tokens",
) -> dict[str, Any]:
    """The request's sampling settings that are set, under the names an API gives them."""
    out: dict[str, Any] = {}
    if request.temperature is not None:
        out[temperature] = request.temperature
    if request.top_p is not None:
        out[top_p] = request.top_p
    if request.max_tokens is not None:
        out[max_tokens] = request.max_tokens
    return out


def append_turn(
    turns: list[dict[str, Any]], role: str, items: list[dict[str, Any]], key: str
) -> None:
    """Add `items` as a turn of `role` (its list under `key`), merged into the last turn when
    that has the same role: APIs that want turns to alternate (Anthropic's, Gemini's)."""
    if not items:
        return
    if turns and turns[-1]["role"] == role:
        turns[-1][key] += items
    else:
        turns.append({"role": role, key: items})


def plain_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` without what other APIs keep in them to continue a conversation (an
    assistant message's `_signatures`): OpenAI refuses fields it does not know."""
    if not any(SIGNATURES in m for m in messages):
        return messages
    return [{k: v for k, v in m.items() if k != SIGNATURES} for m in messages]


class OpenAIWire:
    """The OpenAI chat-completions wire (`service.providers.http.Wire`)."""

    done_data: str | None = "[DONE]"

    def __init__(self, reasoning_style: ReasoningStyle, extra_body: Mapping[str, Any]) -> None:
        self.reasoning_style = reasoning_style
        self.extra_body = extra_body
        self._decoder: functools.partial[ModelDelta | None] | None = None

    def url(self, base_url: str, request: ModelRequest) -> str:
        return base_url + "/chat/completions"

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"}

    def body(self, request: ModelRequest) -> dict[str, Any]:
        return request_body(request, self.reasoning_style, self.extra_body)

    def decoder(
        self, provider: str, scrub: Callable[[str], str]
    ) -> Callable[[str], ModelDelta | None]:
        """Its chunks need no state of their stream: one decoder serves all of them."""
        made = self._decoder
        if made is None or made.args != (provider,) or made.keywords["scrub"] is not scrub:
            made = self._decoder = functools.partial(parse_chunk, provider, scrub=scrub)
        return made


def encode_body(body: dict[str, Any]) -> bytes:
    """`body` as compact UTF-8 JSON."""
    try:
        return orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # e.g. an integer beyond 64 bits
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def parse_chunk(provider: str, data: str, scrub: Callable[[str], str] = str) -> ModelDelta | None:
    """One SSE data payload → one ModelDelta, or None when the chunk carries nothing.

    Raises `ProviderError` (and nothing else) for a payload that is not JSON, an
    error object, or a chunk of the wrong shape. `scrub` masks secrets in any
    provider text quoted in an error message, before it is cut.
    """
    obj = load_object(provider, data, scrub)
    if obj.get("error"):
        err = obj["error"]
        msg = message_of(obj) or _text_of(err)
        code = err.get("code") if isinstance(err, dict) else None
        status = code if isinstance(code, int) and 100 <= code <= 599 else None
        raise ProviderStreamError(provider, f"stream error: {_clip(msg, scrub)}", status=status)
    try:
        return _delta(obj)
    except Malformed as exc:
        raise ProviderError(provider, f"malformed stream chunk: {exc}") from None


def load_object(provider: str, data: str, scrub: Callable[[str], str] = str) -> dict[str, Any]:
    """An event's data as the JSON object it must be (of any API's stream), or a
    `ProviderError` quoting it (`scrub` masks secrets in the quote)."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            obj = _without_surrogates(json.loads(data))
        except (ValueError, RecursionError):
            shown = _clip(data, scrub, _MAX_QUOTED)
            raise ProviderError(provider, f"invalid JSON in stream: {shown!r}") from None
    if not isinstance(obj, dict):
        shown = _clip(data, scrub, _MAX_QUOTED)
        raise ProviderError(provider, f"unexpected stream payload: {shown!r}")
    return obj


def stream_error(provider: str, obj: dict[str, Any], scrub: Callable[[str], str]) -> NoReturn:
    """Raise the error an event of a stream reports (its message, masked and cut)."""
    err = obj.get("error")
    what = err.get("type", "") if isinstance(err, dict) else ""
    msg = message_of(obj) or _text_of(err)
    shown = f"{what}: {msg}" if what and isinstance(what, str) else msg
    raise ProviderStreamError(provider, f"stream error: {_clip(shown, scrub)}")


def named_tool(choice: Any) -> str:
    """The function a tool choice names (`{"type": "function", "function": {"name": …}}`),
    or "" for "auto", "none", "required" and None."""
    if isinstance(choice, dict):
        function = choice.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return str(function["name"])
    return ""


def error_message(raw: bytes, scrub: Callable[[str], str] = str) -> str:
    """The provider's message from an error body: `error.message`, else the text.

    Secrets are masked by `scrub` before the message is cut to 500 characters.
    """
    text = raw.decode("utf-8", "replace").strip()
    try:
        msg = message_of(json.loads(text))
    except (ValueError, RecursionError):
        msg = ""
    return _clip(msg or text, scrub) or "(empty body)"


def error_code(raw: bytes) -> str:
    """The provider's code of an error body (`error.code`, `error.type` or `error.status`:
    OpenAI, Anthropic and Gemini put it there), or ""."""
    try:
        obj = json.loads(raw.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return ""
    err = obj.get("error") if isinstance(obj, dict) else None
    if not isinstance(err, dict):
        return ""
    for key in ("code", "type", "status"):
        value = err.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


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


class Malformed(Exception):
    """A field of a stream's event has the wrong type; the message names the field and
    what it is."""

    def __init__(self, where: str, value: Any, expected: str) -> None:
        super().__init__(f"{where} is {_kind(value)}, expected {expected}")


def _delta(obj: dict[str, Any]) -> ModelDelta | None:
    """The ModelDelta of a decoded chunk: choice 0's delta and the usage, checked field by field.

    On the per-chunk hot path: checks are inline and a field's location is only
    spelled out when it is wrong.
    """
    raw_usage = obj.get("usage")
    usage = None if raw_usage is None else _usage(raw_usage)
    found = _choice_zero(obj.get("choices"))
    if found is None:
        return None if usage is None else ModelDelta(usage=usage)
    pos, choice = found
    delta = choice.get("delta")
    if delta is None:
        delta = {}
    elif type(delta) is not dict:
        raise Malformed(f"choices[{pos}].delta", delta, "an object")
    content = delta.get("content") or None
    if content is not None and type(content) is not str:
        raise Malformed(f"choices[{pos}].delta.content", content, "a string")
    # Alternative reasoning fields are read only when they are strings (some
    # providers use the same names for structured data).
    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or None
    if reasoning is not None and type(reasoning) is not str:
        reasoning = None
    finish = choice.get("finish_reason") or None
    if finish is not None and type(finish) is not str:
        raise Malformed(f"choices[{pos}].finish_reason", finish, "a string")
    tool_calls: tuple[ToolCallDelta, ...] = ()
    raw_calls = delta.get("tool_calls")
    if raw_calls is not None:
        tool_calls = tuple(_tool_calls(raw_calls, f"choices[{pos}].delta.tool_calls"))
    if content is None and reasoning is None and not tool_calls and finish is None:
        return None if usage is None else ModelDelta(usage=usage)
    return ModelDelta(reasoning, content, tool_calls, finish, usage)


def _choice_zero(raw: Any) -> tuple[int, dict[str, Any]] | None:
    """(position, choice) of the choice with index 0; the other choices (n > 1) are ignored."""
    if raw is None:
        return None
    if type(raw) is not list:
        raise Malformed("choices", raw, "a list")
    found: tuple[int, dict[str, Any]] | None = None
    for pos, choice in enumerate(raw):
        if type(choice) is not dict:
            raise Malformed(f"choices[{pos}]", choice, "an object")
        index = choice.get("index")
        if index is None:
            index = pos
        elif type(index) is not int or not 0 <= index <= _MAX_INDEX:
            raise Malformed(f"choices[{pos}].index", index, _INDEX_RANGE)
        if index == 0 and found is None:
            found = (pos, choice)
    return found


def _tool_calls(raw: Any, where: str) -> list[ToolCallDelta]:
    if type(raw) is not list:
        raise Malformed(where, raw, "a list")
    out: list[ToolCallDelta] = []
    for pos, call in enumerate(raw):
        if type(call) is not dict:
            raise Malformed(f"{where}[{pos}]", call, "an object")
        fn = call.get("function")
        if fn is None:
            fn = {}
        elif type(fn) is not dict:
            raise Malformed(f"{where}[{pos}].function", fn, "an object")
        index = call.get("index")
        if index is None:
            index = pos
        elif type(index) is not int or not 0 <= index <= _MAX_INDEX:
            raise Malformed(f"{where}[{pos}].index", index, _INDEX_RANGE)
        call_id, name, arguments = call.get("id"), fn.get("name"), fn.get("arguments")
        for key, value in (
            ("id", call_id),
            ("function.name", name),
            ("function.arguments", arguments),
        ):
            if value is not None and type(value) is not str:
                raise Malformed(f"{where}[{pos}].{key}", value, "a string")
        if call_id or name or arguments:
            out.append(ToolCallDelta(index, call_id or None, name or None, arguments or ""))
    return out


def _usage(raw: Any) -> Usage | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise Malformed("usage", raw, "an object")
    details = object_field(raw, "completion_tokens_details", "usage")
    prompt_details = object_field(raw, "prompt_tokens_details", "usage")
    prompt = count(raw, "prompt_tokens", "usage")
    completion = count(raw, "completion_tokens", "usage")
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=count(raw, "total_tokens", "usage") or prompt + completion,
        reasoning_tokens=count(details, "reasoning_tokens", "usage.completion_tokens_details"),
        cached_tokens=count(prompt_details, "cached_tokens", "usage.prompt_tokens_details"),
    )


def count(obj: dict[str, Any], key: str, where: str = "") -> int:
    """A token count (a non-negative integer) of the object at `where`; absent or null is 0."""
    value = obj.get(key)
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_COUNT:
        raise Malformed(_path(where, key), value, f"an integer from 0 to {_MAX_COUNT}")
    return value


def object_field(obj: dict[str, Any], key: str, where: str = "") -> dict[str, Any]:
    """An object field of the object at `where`; absent or null is {}."""
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Malformed(_path(where, key), value, "an object")
    return value


def string_field(obj: dict[str, Any], key: str, where: str = "") -> str:
    """A string field of the object at `where`; absent or null is ""."""
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Malformed(_path(where, key), value, "a string")
    return value


def _path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _kind(value: Any) -> str:
    """How a wrong value is named in an error: its JSON type, and the value when short."""
    name = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)
    if isinstance(value, bool | int | float):
        shown = repr(value)
        return f"{name} ({shown[:40]})"
    return name


def _without_surrogates(value: Any) -> Any:
    """`value` with unpaired UTF-16 surrogates (from JSON escapes such as "\\ud800") as U+FFFD.

    Python's `json` accepts them, but they cannot be encoded as UTF-8: left in,
    they would fail the run's events and its record.
    """
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_without_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_without_surrogates(k): _without_surrogates(v) for k, v in value.items()}
    return value


def _clip(text: str, scrub: Callable[[str], str], limit: int = _MAX_MESSAGE) -> str:
    """A provider's text for an error message: secrets masked by `scrub` before it is cut
    to `limit` characters (and again after, for a secret the provider had cut), no surrogates."""
    text = scrub(_SURROGATE.sub("\ufffd", text))
    return scrub(text[:limit]) + "…" if len(text) > limit else text


def _text_of(value: Any) -> str:
    """`str(value)`, or a placeholder when it is too deeply nested to print."""
    try:
        return str(value)
    except RecursionError:
        return f"({_kind(value)} nested too deeply to show)"


def message_of(obj: Any) -> str:
    """`error.message` (or `message`/`msg`/`detail`, or a string `error`) of a JSON error."""
    if not isinstance(obj, dict):
        return ""
    err = obj.get("error", obj)
    if isinstance(err, str):
        return err
    if isinstance(err, dict):
        for k in ("message", "msg", "detail"):
            if isinstance(err.get(k), str) and err[k]:
                return str(err[k])
    return ""


def merge(into: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            into[k] = dict(into[k])
            merge(into[k], v)
        else:
            into[k] = v
