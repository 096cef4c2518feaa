"""Protobuf → JSON as the HTTP adapter speaks it: fast, descriptor-driven, camelCase.

The output follows the proto3 JSON mapping (camelCase `json_name`s, fields at
their default value left out, enums by name, bytes as base64, Struct/Value as
plain JSON) with two deliberate differences, both part of the HTTP contract:

* 64-bit integers are JSON numbers, not strings (`"seq": 3`, not `"seq": "3"`);
* an `agw.v1.Event` is *flat*: its envelope (`seq`, `type`, `timestamp`,
  `chatId`, `runId`, `taskId`, `parentToolId`) and its payload's fields are one
  object, e.g. `{"seq":3,"type":"content.delta",…,"contentId":"…","delta":"Hi"}` — wherever
  an event appears, in an SSE message or inside a unary response.

Event JSON is produced once per streamed event, so this is on the hot path. A
plan per message type (field → JSON name and converter) is built on first use;
encoding walks only the fields that are set (`ListFields`, done in C by upb) and
`orjson` writes the bytes. `bench/sse.py` measures it against `json_format`.
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Callable
from typing import Any, TypeAlias

import orjson
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

#: Messages whose oneof (by name) is merged into the message's own object.
FLATTENED_ONEOFS: dict[str, str] = {"agw.v1.Event": "payload"}

_Convert: TypeAlias = Callable[[Any], Any]
#: field → (JSON name, converter or None for values JSON takes as they are, flattened?)
_Plan: TypeAlias = dict[FieldDescriptor, tuple[str, _Convert | None, bool]]

_plans: dict[Descriptor, _Plan] = {}


def to_dict(message: Message) -> dict[str, Any]:
    """The message as a JSON-ready dict (see the module's mapping)."""
    descriptor: Any = message.DESCRIPTOR  # upb or pure-Python descriptor
    plan = _plans.get(descriptor)
    if plan is None:
        plan = _plan(descriptor)
    out: dict[str, Any] = {}
    for field, value in message.ListFields():
        name, convert, flat = plan[field]
        if convert is not None:
            value = convert(value)
        if flat:
            out.update(value)
        else:
            out[name] = value
    return out


def to_json(message: Message) -> bytes:
    """The message as compact UTF-8 JSON bytes (one line: newlines inside strings are escaped)."""
    return orjson.dumps(to_dict(message))


def _plan(descriptor: Descriptor) -> _Plan:
    flat_oneof = FLATTENED_ONEOFS.get(descriptor.full_name)
    plan: _Plan = {}
    _plans[descriptor] = plan  # registered before recursing, for recursive message types
    for field in descriptor.fields:
        flat = field.containing_oneof is not None and field.containing_oneof.name == flat_oneof
        plan[field] = (field.json_name, _field_converter(field), flat)
    return plan


def _field_converter(field: FieldDescriptor) -> _Convert | None:
    if _is_map(field):
        entry = _message_type(field)
        convert_value = _value_converter(entry.fields_by_name["value"])
        key_field = entry.fields_by_name["key"]
        is_bool_key = key_field.type == FieldDescriptor.TYPE_BOOL
        if convert_value is None:
            if key_field.type == FieldDescriptor.TYPE_STRING:
                return dict
            return lambda m: {_map_key(k, is_bool_key): v for k, v in m.items()}
        convert = convert_value
        return lambda m: {_map_key(k, is_bool_key): convert(v) for k, v in m.items()}
    convert_one = _value_converter(field)
    if field.is_repeated:
        if convert_one is None:
            return list
        item = convert_one
        return lambda values: [item(v) for v in values]
    return convert_one


def _value_converter(field: FieldDescriptor) -> _Convert | None:
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE or kind == FieldDescriptor.TYPE_GROUP:
        return _message_converter(_message_type(field))
    if kind == FieldDescriptor.TYPE_ENUM:
        enum = field.enum_type
        assert enum is not None
        if enum.full_name == "google.protobuf.NullValue":
            return lambda _: None
        names = {v.number: v.name for v in enum.values}
        return lambda number: names.get(number, number)
    if kind == FieldDescriptor.TYPE_BYTES:
        return lambda data: base64.b64encode(data).decode("ascii")
    if kind == FieldDescriptor.TYPE_DOUBLE:
        return _double
    if kind == FieldDescriptor.TYPE_FLOAT:
        return _float32
    return None  # strings, bools and integers are JSON as they are


def _message_converter(descriptor: Descriptor) -> _Convert:
    name = descriptor.full_name
    if name == "google.protobuf.Struct":
        return _struct
    if name == "google.protobuf.Value":
        return _value
    if name == "google.protobuf.ListValue":
        return _list_value
    if descriptor.file.package == "google.protobuf":
        # Timestamp, Duration, wrappers, Any, FieldMask: rare here; json_format knows them.
        return json_format.MessageToDict
    return to_dict


def _struct(message: Any) -> dict[str, Any]:
    return {key: _value(value) for key, value in message.fields.items()}


def _list_value(message: Any) -> list[Any]:
    return [_value(value) for value in message.values]


def _value(message: Any) -> Any:
    kind = message.WhichOneof("kind")
    if kind == "string_value":
        return message.string_value
    if kind == "number_value":
        return _double(message.number_value)
    if kind == "bool_value":
        return message.bool_value
    if kind == "struct_value":
        return _struct(message.struct_value)
    if kind == "list_value":
        return _list_value(message.list_value)
    return None


def _double(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _float32(value: float) -> float | str:
    if not math.isfinite(value):
        return _double(value)
    for digits in range(6, 10):  # the shortest decimal that reads back as the same float32
        short = float(f"{value:.{digits}g}")
        if struct.unpack("f", struct.pack("f", short))[0] == value:
            return short
    return value


def _map_key(key: Any, is_bool: bool) -> str:
    if is_bool:
        return "true" if key else "false"
    return str(key)


def _is_map(field: FieldDescriptor) -> bool:
    return (
        field.is_repeated
        and field.type == FieldDescriptor.TYPE_MESSAGE
        and _message_type(field).GetOptions().map_entry
    )


def _message_type(field: FieldDescriptor) -> Descriptor:
    descriptor = field.message_type
    assert descriptor is not None, field.full_name
    return descriptor
