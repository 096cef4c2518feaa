"""A turn's first output is written to the stream before the run goes on with the rest of
what it read: real gRPC server on loopback, real HTTP client, fake provider.

The provider sends the whole answer at once (one write: the delta, the finish, the end),
so the service reads it in one piece; the first delta is on the stream before the turn's
end is emitted, not after the run's end.
"""

from __future__ import annotations

import json

import pytest
from agw.v1 import events_pb2 as pb

from service.core.events import Event
from service.core.run import eventlog
from service.core.run.eventlog import EventLog
from service.providers.loopback import LoopbackProvider, content, finish, usage
from service.testing import Harness
from service.transport.heartbeat import StreamWriter
from tests.transport.test_chat_lifecycle import RUN


def in_one_piece(*chunks: dict) -> bytes:
    """The chunks and the stream's end, as one write."""
    events = [json.dumps(c).encode() for c in chunks] + [b"[DONE]"]
    return b"".join(b"data: " + data + b"\n\n" for data in events)


async def test_the_first_delta_is_written_before_the_rest_of_the_answer_is_handled(
    gateway: Harness, provider: LoopbackProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    happened: list[str] = []
    emit, write = EventLog.emit, StreamWriter.write

    def recorded_emit(self: EventLog, event: Event) -> Event:
        happened.append("emitted " + (event.WhichOneof("payload") or ""))
        return emit(self, event)

    async def recorded_write(self: StreamWriter, event: pb.Event) -> None:
        await write(self, event)
        happened.append("written " + event.type)

    monkeypatch.setattr(EventLog, "emit", recorded_emit)
    monkeypatch.setattr(StreamWriter, "write", recorded_write)
    monkeypatch.setattr(eventlog, "HAND_ON_S", 10.0)  # however slow the box
    provider.enqueue([in_one_piece(content("Hi"), finish("stop"), usage(3, 1))])
    events = await gateway.query("plain", "Hello")
    assert [e.type for e in events] == RUN
    assert happened.index("written content.delta") < happened.index("emitted content_end")
    assert happened[-1] == "written run.complete"
