"""What the benchmark's processes tell each other: a stream's shape, and stamped deltas.

The load client puts a `StreamSpec` in the query's message. The servers under
test pass it on unchanged (the relays as the user message of their provider
request, the gateway through its ONESHOT agent); the fake provider — or the bare
baseline, which has no provider — reads it back and plays the stream it
describes. Every delta's text is a *stamp*: the `CLOCK_MONOTONIC` time at which
it was sent, and how late that was against its schedule (both in ns). The
monotonic clock is system-wide on Linux, so the client can subtract the send
time from its own arrival time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

HOST = "127.0.0.1"  # every socket of the benchmark lives on loopback
AGENT_KEY = "bench"
MODEL = "bench-model"
# The gateway as configured by default (no exporter), with the OpenTelemetry SDK installed
# (discarding exporters), and with its instrumentation short-circuited — twice, in two
# processes, to see how much two processes of the same server differ (bench/otel.py).
GATEWAYS = ("gateway", "gateway+otel", "gateway-no-otel", "gateway-no-otel-2")
# The servers under test; `relay-contract` is the aiohttp relay writing the events of a
# run's stream contract too (bench/relay.py): the floor the contract itself sets.
SERVERS = ("bare", "relay", "relay-aiohttp", "relay-contract", *GATEWAYS)
# The gateway is judged against the relay on the HTTP client it uses itself (aiohttp).
REFERENCE = "relay-aiohttp"
# The servers whose highest sustained paced rate is measured (the capacity ramp): the two
# compared, whose common sustained rate the paced load then runs at.
RAMPED = PACED_AT_COMMON_RATE = (REFERENCE, "gateway")
_PREFIX = "bench"

# One OpenAI `chat.completion.chunk` per delta, byte for byte what a provider sends.
_DELTA_CHUNK = (
    'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
    '"model":"bench-model","choices":[{"index":0,"delta":{"content":"%s"},'
    '"finish_reason":null}]}\n\n'
)
FINISH_CHUNK = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"bench-model","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
)
USAGE_CHUNK = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"bench-model","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,'
    b'"total_tokens":17}}\n\n'
)


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """One stream: `deltas` deltas, `interval_ms` apart (0: all at once).

    `phase_ms` delays the first delta (spreads paced streams over the interval; unpaced,
    it is the provider's time to first token);
    `hold_s` keeps the stream open and silent after the deltas (an idle stream).
    """

    deltas: int
    interval_ms: float = 0.0
    phase_ms: float = 0.0
    hold_s: float = 0.0

    def to_message(self) -> str:
        return (
            f"{_PREFIX} deltas={self.deltas} interval_ms={self.interval_ms:g} "
            f"phase_ms={self.phase_ms:g} hold_s={self.hold_s:g}"
        )

    @classmethod
    def parse(cls, message: str) -> StreamSpec:
        """The spec in a query message; ValueError when it is not one."""
        words = message.split()
        if not words or words[0] != _PREFIX:
            raise ValueError(f"not a benchmark stream spec: {message[:80]!r}")
        fields = dict(word.split("=", 1) for word in words[1:])
        return cls(
            deltas=int(fields["deltas"]),
            interval_ms=float(fields.get("interval_ms", 0)),
            phase_ms=float(fields.get("phase_ms", 0)),
            hold_s=float(fields.get("hold_s", 0)),
        )


def stamp(lag_ns: int) -> str:
    """The text of a delta sent now, `lag_ns` after its due time."""
    return f"{time.monotonic_ns()} {lag_ns}"


def parse_stamp(text: str) -> tuple[int, int]:
    """(send time, lag) of a delta's text, both in ns."""
    sent, lag = text.split(" ", 1)
    return int(sent), int(lag)


def delta_chunk(lag_ns: int) -> bytes:
    """The SSE event of one delta, stamped now."""
    return (_DELTA_CHUNK % stamp(lag_ns)).encode()


async def schedule(spec: StreamSpec) -> AsyncIterator[int]:
    """Yield once per delta, at its due time; the value is how late it is (ns).

    Due times are absolute (phase + i × interval from the start), so a late
    delta does not push back the ones after it. Unpaced specs yield at once, after `phase_ms`.
    """
    if spec.interval_ms <= 0:
        if spec.phase_ms > 0:  # the first token's wait (a provider's TTFT), then all at once
            await asyncio.sleep(spec.phase_ms / 1e3)
        for _ in range(spec.deltas):
            yield 0
        return
    interval = spec.interval_ms * 1_000_000
    start = time.monotonic_ns() + int(spec.phase_ms * 1_000_000)
    for i in range(spec.deltas):
        due = start + int(i * interval)
        now = time.monotonic_ns()
        if due > now:
            await asyncio.sleep((due - now) / 1e9)
            now = time.monotonic_ns()
        yield max(0, now - due)
