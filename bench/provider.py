"""The fake provider of the benchmark: `LoopbackProvider` playing the stream each query asks for.

It reads the `StreamSpec` from the request's last user message and streams that
many stamped `chat.completion.chunk` deltas — all at once, or paced — then the
finish and usage chunks and `[DONE]`. The chunks are pre-encoded bytes, so the
provider process spends as little as possible per delta.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from bench.protocol import FINISH_CHUNK, USAGE_CHUNK, StreamSpec, delta_chunk, schedule
from service.providers.loopback import DONE, LoopbackProvider, Pause, ScriptItem


def spec_of(body: dict[str, Any]) -> StreamSpec:
    """The spec in the request's last user message."""
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            return StreamSpec.parse(str(message.get("content") or ""))
    raise ValueError("no user message")


async def play(spec: StreamSpec) -> AsyncIterator[ScriptItem]:
    """The script of one stream; each delta is stamped as it is handed to the writer."""
    async for lag in schedule(spec):
        yield delta_chunk(lag)
    if spec.hold_s > 0:
        yield Pause(spec.hold_s)
    yield FINISH_CHUNK
    yield USAGE_CHUNK
    yield DONE


def responder(body: dict[str, Any]) -> AsyncIterator[ScriptItem]:
    return play(spec_of(body))


def bench_provider() -> LoopbackProvider:
    return LoopbackProvider(responder, models=("bench-model",), max_recorded=2)
