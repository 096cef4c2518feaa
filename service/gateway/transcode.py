"""HTTP request → protobuf request message, as the route's annotation says.

The fields of the request come from three places, in the grpc-gateway way:

* the path variables (`{run_id}` fills `run_id`);
* the JSON body, when the annotation has `body` (`"*"`: the whole request,
  otherwise the named field);
* the query string, for the fields neither of those bound. Names may be the
  JSON name or the proto name (`agentKey` or `agent_key`), nested fields are
  dotted (`a.b`), repeated fields repeat the key, message fields take JSON.

A request that does not fit the message (unknown field, wrong type, bad JSON)
raises `BadRequest`, which the adapter answers as INVALID_ARGUMENT; its message
echoes the client's names and values only `shown` (cut short).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from multidict import MultiMapping

from service.gateway.routes import Route
from service.gateway.status import shown

_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})
#: The longest message of a parser (which may quote the input) that a BadRequest repeats.
_PARSER_MESSAGE_CHARS = 160


class BadRequest(ValueError):
    """The HTTP request cannot be transcoded into the RPC's request message."""


def decode_request(
    route: Route,
    path_params: Mapping[str, str],
    query: MultiMapping[str],
    body: bytes,
) -> Message:
    """Build the request message of `route` from the parts of an HTTP request."""
    descriptor = route.method.input_type
    document: dict[str, Any] = {}
    if route.body == "*":
        document = _json_object(body)
    elif route.body and body.strip():
        _place(document, descriptor, route.body, _json_value(body), raw=False)
    bound = {route.body} if route.body and route.body != "*" else set()
    for variable, field_path in route.variables:
        _place(document, descriptor, field_path, path_params[variable], raw=True)
        bound.add(field_path)
    if route.body != "*":
        for key in query:
            if key in bound:
                continue
            values = query.getall(key)
            _place(document, descriptor, key, values, raw=True, multi=True)
    message = route.request_class()
    try:
        json_format.ParseDict(document, message)
    except json_format.ParseError as error:
        raise BadRequest(shown(str(error), _PARSER_MESSAGE_CHARS)) from None
    return message


def _json_object(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    value = _json_value(body)
    if not isinstance(value, dict):
        raise BadRequest("the request body must be a JSON object")
    return value


def _json_value(text: bytes | str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise BadRequest(f"invalid JSON: {shown(str(error), _PARSER_MESSAGE_CHARS)}") from None


def _place(
    document: dict[str, Any],
    descriptor: Descriptor,
    field_path: str,
    value: Any,
    *,
    raw: bool,
    multi: bool = False,
) -> None:
    """Put `value` at `field_path` of the JSON `document`, converting text by the field's type."""
    parts = field_path.split(".")
    target = document
    for index, part in enumerate(parts):
        field = _field(descriptor, part, field_path)
        last = index == len(parts) - 1
        if not last:
            if field.type != FieldDescriptor.TYPE_MESSAGE or field.is_repeated:
                raise BadRequest(f"{shown(field_path)!r}: {shown(part)!r} is not a message field")
            nested = target.setdefault(field.json_name, {})
            if not isinstance(nested, dict):
                raise BadRequest(f"{shown(field_path)!r}: {shown(part)!r} is given twice")
            assert field.message_type is not None
            target, descriptor = nested, field.message_type
            continue
        if not raw:
            target[field.json_name] = value
        elif multi:
            converted = [_from_text(field, text, field_path) for text in value]
            if field.is_repeated:
                target[field.json_name] = converted
            elif len(converted) > 1:
                raise BadRequest(f"{shown(field_path)!r} is given more than once")
            else:
                target[field.json_name] = converted[0]
        else:
            target[field.json_name] = _from_text(field, value, field_path)


def _field(descriptor: Descriptor, name: str, field_path: str) -> FieldDescriptor:
    field = descriptor.fields_by_name.get(name) or descriptor.fields_by_camelcase_name.get(name)
    if field is None:
        raise BadRequest(f"unknown parameter {shown(field_path)!r} for {descriptor.name}")
    return field


def _from_text(field: FieldDescriptor, text: str, field_path: str) -> Any:
    """A path or query parameter as the JSON value `json_format` expects for `field`."""
    kind = field.type
    if kind == FieldDescriptor.TYPE_BOOL:
        lowered = text.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise BadRequest(f"{shown(field_path)!r}: expected true or false, got {shown(text)!r}")
    if kind == FieldDescriptor.TYPE_ENUM:
        return int(text) if text.lstrip("-").isdigit() else text
    if kind in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP):
        assert field.message_type is not None
        if field.message_type.full_name == "google.protobuf.Value":
            try:
                return orjson.loads(text)
            except orjson.JSONDecodeError:
                return text  # a bare word is a string value
        return _json_value(text)
    return text  # strings, bytes (base64), and numbers, which json_format parses from text
