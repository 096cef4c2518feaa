"""The event JSON of the adapter: flat, camelCase, 64-bit integers as numbers.

Every variant of the contract is filled field by field from its descriptor and
encoded; the result must equal `json_format` (the reference implementation of
the proto3 JSON mapping) with the envelope and payload merged.
"""

from __future__ import annotations

import math

import orjson
import pytest
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from google.protobuf import json_format, struct_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from service.core.events import EVENT_TYPES
from service.gateway import codec

PAYLOADS = [f.name for f in pb.Event.DESCRIPTOR.oneofs_by_name["payload"].fields]
ENVELOPE = [f.json_name for f in pb.Event.DESCRIPTOR.fields if f.containing_oneof is None]


def fill(message: Message, depth: int = 0) -> Message:
    """Set every field of `message` to a non-default sample value."""
    descriptor: Descriptor = message.DESCRIPTOR
    if descriptor.full_name == "google.protobuf.Struct":
        message.update({"n": 1.5, "s": "x", "b": True, "z": None, "l": [1.0, "y", {"k": "v"}]})  # type: ignore[attr-defined]
        return message
    if descriptor.full_name == "google.protobuf.Value":
        json_format.ParseDict({"answer": [42.0, "yes", None]}, message)
        return message
    for field in descriptor.fields:
        if field.containing_oneof is not None and field.containing_oneof.name == "payload":
            continue
        values = [_sample(field, i, depth) for i in range(2 if field.is_repeated else 1)]
        target = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            target.update({"alpha": "one", "beta": "two"})
        elif field.is_repeated and field.type == FieldDescriptor.TYPE_MESSAGE:
            for value in values:
                target.add().CopyFrom(value)
        elif field.is_repeated:
            target.extend(values)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            target.CopyFrom(values[0])
        else:
            setattr(message, field.name, values[0])
    return message


def _sample(field: FieldDescriptor, index: int, depth: int) -> object:
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        assert field.message_type is not None
        cls = json_format.message_factory.GetMessageClass(field.message_type)
        return fill(cls(), depth + 1)
    if kind == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        return field.enum_type.values[-1 - index].number
    if kind == FieldDescriptor.TYPE_BOOL:
        return True
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return 0.25 + index
    if kind == FieldDescriptor.TYPE_BYTES:
        return b"\x00\xffbytes"
    if kind == FieldDescriptor.TYPE_STRING:
        return f'{field.name}-{index} «ünïcode» "quoted"\nline'
    wide = field.cpp_type in (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)
    return 1_732_200_000_000 + index if wide else 7 + index


def event_of(payload: str) -> pb.Event:
    event = pb.Event(
        seq=12,
        type=EVENT_TYPES[payload],
        timestamp=1_732_200_000_123,
        chat_id="chat-1",
        run_id="run-1",
        task_id="task-1",
        parent_tool_id="call-1",
    )
    getattr(event, payload).SetInParent()
    fill(getattr(event, payload))
    return event


def reference(event: pb.Event) -> dict[str, object]:
    """json_format's rendering, with 64-bit numbers unquoted and the payload merged in."""
    out = json_format.MessageToDict(event, unquote_int64_if_possible=True)
    payload = event.WhichOneof("payload")
    assert payload is not None
    out.update(out.pop(pb.Event.DESCRIPTOR.fields_by_name[payload].json_name))
    return out


@pytest.mark.parametrize("payload", PAYLOADS)
def test_every_variant_matches_the_reference_mapping(payload: str) -> None:
    event = event_of(payload)
    encoded = codec.to_json(event)
    assert b"\n" not in encoded  # one SSE data line
    decoded = orjson.loads(encoded)
    assert decoded == reference(event)
    fields = pb.Event.DESCRIPTOR.fields_by_name[payload].message_type.fields  # type: ignore[union-attr]
    assert len(decoded) == len(ENVELOPE) + len(fields)  # every field was filled and encoded
    assert list(decoded)[: len(ENVELOPE)] == ENVELOPE  # the envelope leads, in contract order


def test_payload_fields_never_collide_with_the_envelope() -> None:
    for payload in PAYLOADS:
        message = pb.Event.DESCRIPTOR.fields_by_name[payload].message_type
        assert message is not None
        clash = {f.json_name for f in message.fields} & set(ENVELOPE)
        assert not clash, f"{payload}: {clash}"


def test_content_delta_has_the_documented_shape() -> None:
    event = pb.Event(
        seq=3,
        type="content.delta",
        timestamp=1732200000000,
        chat_id="c1",
        run_id="r1",
        content_delta=pb.ContentDelta(content_id="r1_c_1", delta="Hi"),
    )
    assert codec.to_json(event) == (
        b'{"seq":3,"type":"content.delta","timestamp":1732200000000,"chatId":"c1",'
        b'"runId":"r1","contentId":"r1_c_1","delta":"Hi"}'
    )


def test_defaults_are_left_out_and_empty_payloads_kept() -> None:
    event = pb.Event(seq=0, type="heartbeat", heartbeat=pb.Heartbeat())
    assert codec.to_dict(event) == {"type": "heartbeat"}
    assert codec.to_dict(pb.Event(seq=1, type="tool.end", tool_end=pb.ToolEnd())) == {
        "seq": 1,
        "type": "tool.end",
    }


def test_64_bit_integers_are_numbers_even_beyond_double_precision() -> None:
    big = 2**62 + 1
    decoded = orjson.loads(codec.to_json(pb.Event(seq=big, type="run.start")))
    assert decoded["seq"] == big


def test_special_values() -> None:
    update = pb.UsageUpdate(call_cost=math.inf, run_cost=math.nan)
    assert codec.to_dict(update) == {"callCost": "Infinity", "runCost": "NaN"}
    upload = gw.UploadRequest(content=b"\x00\x01", name="a")
    assert codec.to_dict(upload) == {"name": "a", "content": "AAE="}
    agent = gw.Agent(key="k", mode=gw.AGENT_MODE_REACT)
    assert codec.to_dict(agent) == {"key": "k", "mode": "AGENT_MODE_REACT"}
    null = struct_pb2.Value(null_value=struct_pb2.NULL_VALUE)
    assert codec.to_dict(pb.ToolResult(tool_id="t", result=null)) == {"toolId": "t", "result": None}


def test_nested_events_are_flat_in_unary_responses() -> None:
    response = gw.GetChatResponse(chat_id="c", events=[event_of("content_snapshot")])
    data = codec.to_dict(response)
    assert data["events"][0]["type"] == "content.snapshot"
    assert data["events"][0]["text"].startswith("text-0")
    assert "contentSnapshot" not in data["events"][0]
