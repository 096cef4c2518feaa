"""Bounded provider streams: lines and events over their limits end the run, memory stays flat.

Through the real transport: a Query over gRPC, the service's own provider client,
and a loopback provider that sends raw bytes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from service.assembly.config import ProviderSettings
from service.providers.loopback import DONE, Gate, LoopbackProvider, ScriptItem, content, finish
from service.testing import FAKE_MODEL, FAKE_PROVIDER, Harness

MiB = 1024 * 1024
FAILED = ["request.query", "chat.start", "run.start", "run.error"]


def kinds(events: list[Any]) -> list[str]:
    return [e.type for e in events]


def rss_bytes() -> int:
    """The resident set size of this process (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@asynccontextmanager
async def gateway_with(
    agents_dir: Path, provider: LoopbackProvider, **settings: Any
) -> AsyncIterator[Harness]:
    """The service with the loopback provider configured with `settings`."""
    fake = ProviderSettings(
        base_url=provider.url,
        default_model=FAKE_MODEL,
        max_retries=0,
        read_timeout_s=10,
        **settings,
    )
    async with Harness.start(agents_dir, provider, providers={FAKE_PROVIDER: fake}) as harness:
        yield harness


async def test_an_unterminated_line_ends_the_run_and_memory_stays_bounded(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    sent = 0

    async def flood() -> AsyncIterator[ScriptItem]:
        """20 MB without a newline, then nothing (the body never ends)."""
        nonlocal sent
        yield b"data: "
        piece = b"x" * (64 * 1024)
        while sent < 20 * MiB:
            sent += len(piece)
            yield piece
        yield Gate(asyncio.Event())

    provider.enqueue([content("warm-up"), finish("stop"), DONE], flood())
    await gateway.query("plain", "hi")  # the first run's one-off allocations are not measured
    baseline = peak = rss_bytes()

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, rss_bytes())
            await asyncio.sleep(0.001)

    sampler = asyncio.create_task(sample())
    try:
        events = await asyncio.wait_for(gateway.query("plain", "hi"), 5.0)
    finally:
        sampler.cancel()
    assert kinds(events) == FAILED
    error = events[-1].run_error.error
    assert error.reason == "PROVIDER_ERROR"
    assert error.message == (
        "provider 'fake': stream rejected: a line exceeded 1048576 bytes "
        "(the provider's max_sse_line_bytes setting)"
    )
    await provider.wait_disconnects(1, timeout=2.0)  # the upstream stream was closed
    assert sent < 20 * MiB  # ... long before the provider was done sending
    assert peak - baseline < 2 * MiB  # the default limit is 1 MiB


def padded_chunk(text: str, padding_lines: int) -> bytes:
    """A content chunk as one event of several data lines: JSON padded with 1,000-space lines."""
    lines = ["{", *[" " * 1000] * padding_lines]
    lines.append('"choices": [{"index": 0, "delta": {"content": "' + text + '"}}]}')
    return b"".join(b"data: " + line.encode() + b"\n" for line in lines) + b"\n"


async def test_event_limit_is_a_provider_setting(
    agents_dir: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        [padded_chunk("fits", 3), finish("stop"), DONE],  # about 3,050 bytes of data
        [content("partial"), padded_chunk("too big", 5)],  # about 5,050 bytes of data
    )
    async with gateway_with(
        agents_dir, provider, max_sse_line_bytes=2000, max_sse_event_bytes=4096
    ) as gateway:
        first = await gateway.query("plain", "hi")
        second = await gateway.query("plain", "hi")
    assert kinds(first)[3:] == ["content.start", "content.delta", "content.end", "run.complete"]
    assert first[4].content_delta.delta == "fits"
    assert kinds(second) == [
        *FAILED[:3],
        "content.start",
        "content.delta",
        "content.end",
        FAILED[3],
    ]
    error = second[-1].run_error.error
    assert (error.reason, error.message) == (
        "PROVIDER_ERROR",
        "provider 'fake': stream rejected: the data of an event exceeded 4096 bytes "
        "(the provider's max_sse_event_bytes setting)",
    )


async def test_line_limit_is_a_provider_setting(
    agents_dir: Path, provider: LoopbackProvider
) -> None:
    long_text = "L" * 3000
    provider.enqueue([content(long_text), finish("stop"), DONE])
    async with gateway_with(agents_dir, provider, max_sse_line_bytes=2048) as gateway:
        events = await gateway.query("plain", "hi")
    assert kinds(events) == FAILED
    assert events[-1].run_error.error.message == (
        "provider 'fake': stream rejected: a line exceeded 2048 bytes "
        "(the provider's max_sse_line_bytes setting)"
    )


async def test_large_chunks_within_the_default_limits_stream(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    big = "b" * (900 * 1024)  # one 900 KiB chunk, under the 1 MiB line limit
    provider.enqueue([content(big), content("!"), finish("stop"), DONE])
    events = await gateway.query("plain", "hi")
    assert kinds(events)[3:] == [
        "content.start",
        "content.delta",
        "content.delta",
        "content.end",
        "run.complete",
    ]
    assert events[4].content_delta.delta == big
