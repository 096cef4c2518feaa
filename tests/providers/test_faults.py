"""Provider faults found under load, each ending its run with a `run.error` that says what
happened: through the real gateway (gRPC on loopback) and the fake provider on loopback.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from service.assembly.config import ProviderSettings
from service.providers.loopback import (
    CLOSE,
    DONE,
    HttpError,
    LoopbackProvider,
    content,
    finish,
)
from service.testing import FAKE_MODEL, FAKE_PROVIDER, Harness

HEAD = ["request.query", "chat.start", "run.start"]
PARTIAL = [*HEAD, "content.start", "content.delta", "content.end", "run.error"]


@pytest.fixture
def retrying() -> dict[str, Any]:
    """Provider settings that retry (twice) before the first byte, as the default does."""
    return {"max_retries": 2, "retry_backoff_s": 0.01}


async def gateway_with(agents_dir: Path, provider: LoopbackProvider, **options: Any) -> Any:
    fake = ProviderSettings(base_url=provider.url, default_model=FAKE_MODEL, **options)
    return Harness.start(agents_dir, provider, providers={FAKE_PROVIDER: fake})


@pytest.fixture
async def gateway(
    agents_dir: Path, provider: LoopbackProvider, retrying: dict[str, Any]
) -> AsyncIterator[Harness]:
    async with await gateway_with(agents_dir, provider, **retrying) as harness:
        yield harness


def error_of(events: list[Any]) -> tuple[str, str, dict[str, str]]:
    error = events[-1].run_error.error
    return error.reason, error.message, dict(error.metadata)


# -- Retry-After beyond the retry cap -------------------------------------------------------


async def test_a_retry_after_beyond_the_cap_fails_at_once_naming_it(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    slow_down = {"error": {"message": "Rate limit reached for requests"}}
    provider.enqueue(
        [HttpError(429, slow_down, headers={"Retry-After": "120"})],
        [content("never"), finish("stop"), DONE],
    )
    started = time.monotonic()
    events = await gateway.query("plain", "hi")
    assert time.monotonic() - started < 2.0  # neither waited out nor retried early
    assert [e.type for e in events] == [*HEAD, "run.error"]
    assert error_of(events) == (
        "PROVIDER_ERROR",
        "provider 'fake': rate-limited the call (HTTP 429: Rate limit reached for requests): "
        "Retry-After 120 s exceeds the retry cap of 30 s "
        "(the provider's max_retry_after_s setting)",
        {"provider": "fake", "status": "429"},
    )
    assert len(provider.requests) == 1


async def test_a_503_retry_after_beyond_the_cap_is_refused_likewise(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    when = "Wed, 21 Oct 2037 07:28:00 GMT"  # an HTTP date, years ahead
    provider.enqueue([HttpError(503, "busy", headers={"Retry-After": when})])
    events = await gateway.query("plain", "hi")
    reason, message, metadata = error_of(events)
    assert (reason, metadata) == ("PROVIDER_ERROR", {"provider": "fake", "status": "503"})
    assert message.startswith("provider 'fake': refused the call (HTTP 503: busy): Retry-After ")
    assert message.endswith(
        " s exceeds the retry cap of 30 s (the provider's max_retry_after_s setting)"
    )
    assert len(provider.requests) == 1


@pytest.mark.parametrize(("cap", "waits"), [(0.5, False), (3.0, True)], ids=["cut", "waited"])
async def test_max_retry_after_s_decides_whether_a_retry_after_is_waited_out(
    agents_dir: Path, provider: LoopbackProvider, cap: float, waits: bool
) -> None:
    provider.enqueue(
        [HttpError(429, {"error": {"message": "later"}}, headers={"Retry-After": "1"})],
        [content("ok"), finish("stop"), DONE],
    )
    started = time.monotonic()
    async with await gateway_with(
        agents_dir, provider, max_retries=1, max_retry_after_s=cap
    ) as gateway:
        events = await gateway.query("plain", "hi")
    elapsed = time.monotonic() - started
    if waits:
        assert events[-1].type == "run.complete"
        assert [e.content_delta.delta for e in events if e.type == "content.delta"] == ["ok"]
        assert elapsed >= 1.0 and len(provider.requests) == 2
    else:
        assert error_of(events)[1] == (
            "provider 'fake': rate-limited the call (HTTP 429: later): Retry-After 1 s exceeds "
            "the retry cap of 0.5 s (the provider's max_retry_after_s setting)"
        )
        assert elapsed < 1.0 and len(provider.requests) == 1


# -- a stream cut inside an event ------------------------------------------------------------


async def test_a_stream_cut_mid_event_says_so_and_is_not_retried(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        [content("Hel"), b'data: {"choices": [{"index": 0, "delta": {"cont', CLOSE],
        [content("duplicate!"), finish("stop"), DONE],
    )
    events = await gateway.query("plain", "hi")
    assert [e.type for e in events] == PARTIAL
    assert events[4].content_delta.delta == "Hel"
    assert error_of(events) == (
        "PROVIDER_ERROR",
        "provider 'fake': stream cut mid-event before completion: the body ended "
        "(ClientPayloadError: Response payload is not completed: <TransferEncodingError: 400, "
        "message='Not enough data to satisfy transfer length header.'>) inside an event, "
        "after 41 bytes of it",
        {"provider": "fake"},
    )
    message = events[-1].run_error.error.message
    assert "invalid JSON" not in message
    assert len(provider.requests) == 1  # no retry after the first delta


async def test_a_body_that_ends_cleanly_mid_event_says_so(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue([content("Hel"), b'data: {"choices": [{"ind'])
    events = await gateway.query("plain", "hi")
    assert [e.type for e in events] == PARTIAL
    assert error_of(events) == (
        "PROVIDER_ERROR",
        "provider 'fake': stream cut mid-event before completion: the body ended inside an "
        "event, after 18 bytes of it",
        {"provider": "fake"},
    )
    assert len(provider.requests) == 1


async def test_a_last_event_without_its_blank_line_is_still_accepted(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    last = json.dumps(finish("stop")).encode()
    provider.enqueue([content("Hello"), b"data: " + last])
    events = await gateway.query("plain", "hi")
    assert events[-1].type == "run.complete"
    assert events[-1].run_complete.finish_reason == "stop"


# -- a successful answer that is not an event stream -------------------------------------------


async def test_an_html_answer_is_not_an_event_stream(
    agents_dir: Path, provider: LoopbackProvider
) -> None:
    page = (
        "<!DOCTYPE html>\n<html><head><title>Sign in</title></head>"
        "<body><form>Bearer sk-fake-SECRET-77 was refused by the proxy; sign in again</form>"
        "</body></html>"
    )
    provider.enqueue(
        [HttpError(200, page, content_type="text/html; charset=utf-8")],
        [content("never"), finish("stop"), DONE],
    )
    async with await gateway_with(
        agents_dir, provider, api_key="sk-fake-SECRET-77", max_retries=2
    ) as gateway:
        events = await gateway.query("plain", "hi")
    assert [e.type for e in events] == [*HEAD, "run.error"]
    assert error_of(events) == (
        "PROVIDER_ERROR",
        "provider 'fake': the answer is not an event stream: HTTP 200 with Content-Type "
        "'text/html; charset=utf-8', body starting '<!DOCTYPE html> <html><head><title>Sign "
        "in</title></head><body><form>*** was refused by the proxy;…'",
        {"provider": "fake", "status": "200"},
    )
    assert len(provider.requests) == 1  # a wrong endpoint: not retried


async def test_a_json_completion_is_not_an_event_stream_and_secrets_are_masked(
    agents_dir: Path, provider: LoopbackProvider
) -> None:
    completion = {"object": "chat.completion", "key": "sk-fake-SECRET-77"}
    provider.enqueue([HttpError(200, completion)])
    async with await gateway_with(
        agents_dir, provider, api_key="sk-fake-SECRET-77", max_retries=0
    ) as gateway:
        events = await gateway.query("plain", "hi")
    message = error_of(events)[1]
    assert message == (
        "provider 'fake': the answer is not an event stream: HTTP 200 with Content-Type "
        """'application/json', body starting '{"object": "chat.completion", "key": "***"}'"""
    )


async def test_a_mislabelled_event_stream_is_still_read(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    body = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in (content("Hi"), finish("stop")))
    provider.enqueue([HttpError(200, body + "data: [DONE]\n\n", content_type="text/plain")])
    events = await gateway.query("plain", "hi")
    assert events[-1].type == "run.complete"
    assert [e.content_delta.delta for e in events if e.type == "content.delta"] == ["Hi"]
