"""Building requests from plain Python values, and reading events back as plain values."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from google.protobuf import json_format, struct_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

Event = pb.Event

#: Event types that end a run; exactly one of them is the last event of every run.
TERMINAL_TYPES = frozenset({"run.complete", "run.error", "run.cancel"})


def new_request_id() -> str:
    """A fresh request id, so that a retried call carries the same one."""
    return uuid.uuid4().hex


def to_struct(value: Mapping[str, Any] | None) -> struct_pb2.Struct | None:
    """A JSON object as a `google.protobuf.Struct` (None stays None)."""
    if value is None:
        return None
    struct = struct_pb2.Struct()
    json_format.ParseDict(dict(value), struct)
    return struct


def to_value(value: Any) -> struct_pb2.Value:
    """Any JSON value (dict, list, str, number, bool, None) as a `google.protobuf.Value`."""
    message = struct_pb2.Value()
    json_format.ParseDict(value, message)
    return message


#: Integers a double holds exactly (JavaScript's safe integers).
MAX_EXACT_INT = 2**53


def plain_numbers(value: Any) -> Any:
    """`value` with its integral floats as ints, in nested lists and dicts too.

    A `google.protobuf.Value` (or `Struct`) holds every number as a double, so a
    JSON 1 sent through one comes back as 1.0; JSON does not tell the two apart,
    and people expect to read back the 1 they wrote.
    """
    if isinstance(value, float):
        exact = value.is_integer() and abs(value) <= MAX_EXACT_INT
        return int(value) if exact else value
    if isinstance(value, dict):
        return {key: plain_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain_numbers(item) for item in value]
    return value


def from_value(value: struct_pb2.Value) -> Any:
    """A `google.protobuf.Value` as a plain JSON value (None when unset); integral numbers
    are ints (see `plain_numbers`)."""
    if value.WhichOneof("kind") is None:
        return None
    return plain_numbers(json_format.MessageToDict(value))


def query_request(
    agent_key: str,
    message: str,
    *,
    chat_id: str = "",
    role: str = "",
    request_id: str = "",
    references: Iterable[pb.Reference] = (),
    params: Mapping[str, Any] | None = None,
    scene: Mapping[str, Any] | None = None,
    stream: bool | None = None,
    debug_level: int = 0,
    **fields: Any,
) -> gw.QueryRequest:
    """A `QueryRequest`; `fields` passes any further field of the message as is."""
    request = gw.QueryRequest(
        agent_key=agent_key,
        message=message,
        chat_id=chat_id,
        role=role,
        request_id=request_id,
        references=list(references),
        params=to_struct(params),
        scene=to_struct(scene),
        debug_level=debug_level,  # type: ignore[arg-type]
        **fields,
    )
    if stream is not None:
        request.stream = stream
    return request


def payload_of(event: pb.Event) -> Message | None:
    """The typed payload of `event` (e.g. a `ContentDelta`), or None when it has none."""
    field = event.WhichOneof("payload")
    return getattr(event, field) if field else None


def event_to_dict(event: pb.Event) -> dict[str, Any]:
    """The event as one flat JSON object: envelope and payload fields side by side, camelCase.

    This is the shape the gateway's HTTP adapter sends over SSE, e.g.
    `{"seq": 3, "type": "content.delta", ..., "contentId": "...", "delta": "Hi"}`.
    64-bit integers are JSON numbers here (the proto JSON mapping would quote them).
    """
    flat: dict[str, Any] = {"seq": event.seq, "type": event.type, "timestamp": event.timestamp}
    for key, value in message_to_dict(event).items():
        if key not in flat and not isinstance(value, dict):
            flat[key] = value
    payload = payload_of(event)
    if payload is not None:
        flat.update(message_to_dict(payload))
    return flat


def message_to_dict(message: Message) -> dict[str, Any]:
    """A message as its proto JSON object (camelCase), with 64-bit integers as numbers and
    integral numbers as ints (see `plain_numbers`)."""
    data: dict[str, Any] = plain_numbers(json_format.MessageToDict(message))
    _unquote_int64(message, data)
    return data


_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def _unquote_int64(message: Message, data: dict[str, Any]) -> None:
    """Turn the quoted 64-bit integers of `data` (the JSON of `message`) back into numbers."""
    field: Any
    for field in message.DESCRIPTOR.fields:
        key = field.json_name
        if key not in data:
            continue
        if field.type in _INT64_TYPES:
            value = data[key]
            data[key] = [int(v) for v in value] if isinstance(value, list) else int(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not _is_well_known(field):
            if field.message_type.GetOptions().map_entry:
                continue  # the contract's maps are string to string
            value = getattr(message, field.name)
            if isinstance(data[key], list):
                for item, item_data in zip(value, data[key], strict=True):
                    _unquote_int64(item, item_data)
            else:
                _unquote_int64(value, data[key])


def _is_well_known(field: Any) -> bool:
    name: str = field.message_type.full_name
    return name.startswith("google.protobuf.")


def set_definition(request: Any, definition: dict[str, Any] | str) -> None:
    """Put an agent's definition in a CreateAgent or UpdateAgent request: JSON data as
    `definition`, an agent file's text as `definition_text`."""
    if isinstance(definition, str):
        request.definition_text = definition
    else:
        request.definition.update(definition)
