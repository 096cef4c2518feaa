"""The load client: opens `Query` streams on a server under test and times every delta.

A `Target` is a server's address with a few gRPC channels (each its own HTTP/2
connection); streams are spread over them round-robin. `run_stream` reads one
stream to its end and records, for each `content.delta`, its arrival time next
to its stamp. `open_streams` opens many streams in bounded batches, so that no
more than `batch` calls are started in one burst.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

import grpc
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc

from bench.protocol import AGENT_KEY, HOST, StreamSpec, parse_stamp

MAX_BURST = 500  # more calls opened at once from one process have been seen CANCELLED


@dataclass(slots=True)
class StreamResult:
    """What the client saw of one stream (times are CLOCK_MONOTONIC ns)."""

    started_ns: int
    first_event_ns: int = 0
    arrivals: list[tuple[int, str]] = field(default_factory=list)  # (arrival, delta text)
    error: str = ""

    @property
    def deltas(self) -> int:
        return len(self.arrivals)

    def latencies_ns(self) -> list[int]:
        """Arrival − send of each delta."""
        return [arrival - parse_stamp(text)[0] for arrival, text in self.arrivals]

    def lags_ns(self) -> list[int]:
        """How late the sender was against its schedule, per delta."""
        return [parse_stamp(text)[1] for _, text in self.arrivals]


class Countdown:
    """A callable that sets `done` once it has been called `count` times."""

    def __init__(self, count: int) -> None:
        self.left = count
        self.done = asyncio.Event()
        if count <= 0:
            self.done.set()

    def __call__(self) -> None:
        self.left -= 1
        if self.left <= 0:
            self.done.set()


class Target:
    """A server under test, reached over `channels` separate connections."""

    def __init__(self, kind: str, port: int, channels: int = 4) -> None:
        self.kind = kind
        options = [("grpc.use_local_subchannel_pool", 1)]  # one connection per channel
        self._channels = [
            grpc.aio.insecure_channel(f"{HOST}:{port}", options=options)
            for _ in range(max(1, channels))
        ]
        self._stubs = [gateway_pb2_grpc.AgentGatewayStub(c) for c in self._channels]
        self._next = 0

    def stub(self) -> gateway_pb2_grpc.AgentGatewayAsyncStub:
        self._next = (self._next + 1) % len(self._stubs)
        return self._stubs[self._next]

    async def ready(self, timeout: float = 30.0) -> None:  # noqa: ASYNC109
        async with asyncio.timeout(timeout):
            for channel in self._channels:
                await channel.channel_ready()

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()


async def run_stream(
    target: Target,
    spec: StreamSpec,
    *,
    started: Callable[[], None] | None = None,
    release: asyncio.Event | None = None,
) -> StreamResult:
    """Read one stream to its end; `started()` is called at its first delta (or its failure).

    With `release`, the stream is held after its first delta until `release` is
    set, and then cancelled by the client (an idle open stream).
    """
    request = gw.QueryRequest(agent_key=AGENT_KEY, message=spec.to_message())
    result = StreamResult(time.monotonic_ns())
    arrivals = result.arrivals
    call = target.stub().Query(request)
    try:
        while True:
            read = await call.read()
            now = time.monotonic_ns()
            if read is grpc.aio.EOF:
                break
            event = cast(pb.Event, read)
            if not result.first_event_ns:
                result.first_event_ns = now
            if event.type == "content.delta":
                arrivals.append((now, event.content_delta.delta))
                if len(arrivals) == 1:
                    if started is not None:
                        notify, started = started, None
                        notify()
                    if release is not None:
                        await release.wait()
                        break
    except grpc.aio.AioRpcError as error:
        result.error = f"{error.code().name}: {error.details()}"
    finally:
        if started is not None:
            started()
        call.cancel()
    return result


async def open_streams(
    target: Target,
    specs: Sequence[StreamSpec],
    batch: int,
    release: asyncio.Event | None = None,
) -> list[asyncio.Task[StreamResult]]:
    """Start the streams, at most `batch` calls per burst; return once all have begun.

    A burst has begun when each of its streams has its first delta (or failed);
    only then is the next one opened. The caller awaits the returned tasks.
    """
    batch = max(1, min(batch, MAX_BURST))
    tasks: list[asyncio.Task[StreamResult]] = []
    for lo in range(0, len(specs), batch):
        chunk = specs[lo : lo + batch]
        begun = Countdown(len(chunk))
        for spec in chunk:
            stream = run_stream(target, spec, started=begun, release=release)
            tasks.append(asyncio.create_task(stream))
        await begun.done.wait()
    return tasks
