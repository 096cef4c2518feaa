"""The message strategy itself: any message type of the contract, valid on the wire."""

from __future__ import annotations

from agw.v1 import events_pb2, gateway_pb2
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.kit import fuzz
from tests.fuzz.protos import messages

DESCRIPTORS: list[Descriptor] = [
    *gateway_pb2.DESCRIPTOR.message_types_by_name.values(),
    *events_pb2.DESCRIPTOR.message_types_by_name.values(),
]


@fuzz(60)
@given(data=st.data())
def test_generated_messages_go_on_the_wire_and_back(data: st.DataObject) -> None:
    descriptor = data.draw(st.sampled_from(DESCRIPTORS), label="type")
    message = data.draw(messages(descriptor, wild=2), label="message")
    assert message.DESCRIPTOR.full_name == descriptor.full_name
    wire = message.SerializeToString(deterministic=True)
    again = type(message)()
    try:
        again.ParseFromString(wire)
    except DecodeError as error:  # only a value nested past the parser's limit of 100
        assert "MaxDepth" in str(error)
        return
    assert again.SerializeToString(deterministic=True) == wire
