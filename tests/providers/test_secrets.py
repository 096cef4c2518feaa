"""Provider secrets never leave the process: masked by value, before any cut, everywhere.

Through the real transport: a Query over gRPC, logs captured at DEBUG on every
logger, and a loopback provider that echoes the credentials back in its errors.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from agw.v1 import gateway_pb2 as gw
from pydantic import SecretStr

from service.assembly.config import ProviderSettings
from service.core.masking import SecretMask
from service.providers.loopback import (
    DONE,
    HttpError,
    LoopbackProvider,
    content,
    error_chunk,
    finish,
)
from service.testing import FAKE_MODEL, FAKE_PROVIDER, Harness

KEY = "sk-Zq7mW2pLx9Vb4Nc8Rt"  # the API key
SUBSCRIPTION = "Hx93k2LqWm7vP0aZ"  # an Ocp-Apim-Subscription-Key header
ORG = "org-Jd83nQ0wLs71Ke"  # a header named in secret_headers
SECRETS = (KEY, SUBSCRIPTION, ORG)
FAILED = ["request.query", "chat.start", "run.start", "run.error"]


def kinds(events: list[Any]) -> list[str]:
    return [e.type for e in events]


@asynccontextmanager
async def gateway_with(
    agents_dir: Path, provider: LoopbackProvider, **settings: Any
) -> AsyncIterator[Harness]:
    options: dict[str, Any] = {
        "base_url": provider.url,
        "default_model": FAKE_MODEL,
        "api_key": SecretStr(KEY),
        "headers": {"Ocp-Apim-Subscription-Key": SUBSCRIPTION, "X-Org": ORG, "X-Team": "blue"},
        "secret_headers": ["x-org"],
        "max_retries": 0,
        "retry_backoff_s": 0.01,
    }
    options.update(settings)
    providers = {FAKE_PROVIDER: ProviderSettings(**options)}
    async with Harness.start(agents_dir, provider, providers=providers) as harness:
        yield harness


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)  # every logger
    return caplog


async def run_and_check(gateway: Harness, logs: pytest.LogCaptureFixture) -> list[Any]:
    """Run a query; assert no secret, nor its first 4 characters, in any log line or event."""
    events = await gateway.query("plain", "hi")
    await gateway.app.frontdoor.flush()
    chat = await gateway.stub.GetChat(
        gw.GetChatRequest(chat_id=events[0].chat_id, include_raw_messages=True)
    )
    seen = [logs.text, *(r.getMessage() for r in logs.records)]
    seen += [str(e) for e in (*events, *chat.events)] + [str(m) for m in chat.raw_messages]
    for secret in SECRETS:
        assert not [text for text in seen if secret[:4] in text], secret
    return events


def message(events: list[Any]) -> str:
    assert kinds(events)[-1] == "run.error"
    error = events[-1].run_error.error
    assert error.reason in ("PROVIDER_ERROR", "PROVIDER_STREAM_ERROR")
    return str(error.message)


def llm_lines(logs: pytest.LogCaptureFixture, kind: str) -> list[str]:
    return [r.getMessage() for r in logs.records if r.name == "agw.llm" and kind in r.getMessage()]


async def test_a_401_echoing_every_credential(
    agents_dir: Path, provider: LoopbackProvider, logs: pytest.LogCaptureFixture
) -> None:
    echo = f"Incorrect API key provided: {KEY} (subscription {SUBSCRIPTION}, org {ORG})."
    provider.enqueue([HttpError(401, {"error": {"message": echo}})])
    async with gateway_with(agents_dir, provider) as gateway:
        events = await run_and_check(gateway, logs)
    assert kinds(events) == FAILED
    assert message(events) == (
        "provider 'fake': HTTP 401: Incorrect API key provided: *** (subscription ***, org ***)."
    )
    headers = provider.request_headers[0]  # the real values were sent
    assert headers["authorization"] == f"Bearer {KEY}"
    assert (headers["ocp-apim-subscription-key"], headers["x-org"]) == (SUBSCRIPTION, ORG)
    (request,) = llm_lines(logs, "llm.request")
    shown = json.loads(request.split(" headers=", 1)[1].split(" body=", 1)[0])
    assert shown["Authorization"] == shown["Ocp-Apim-Subscription-Key"] == shown["X-Org"] == "***"
    assert shown["X-Team"] == "blue"
    assert llm_lines(logs, "llm.end")[0].endswith(
        "error=RefusedCall: provider 'fake': HTTP 401: Incorrect API key provided: *** "
        "(subscription ***, org ***)."
    )


async def test_retries_log_the_masked_error(
    agents_dir: Path, provider: LoopbackProvider, logs: pytest.LogCaptureFixture
) -> None:
    provider.enqueue(
        [HttpError(503, f"overloaded, key {KEY}")],
        [HttpError(429, {"error": {"message": f"slow down {SUBSCRIPTION}"}})],
        [content("ok"), finish("stop"), DONE],
    )
    async with gateway_with(agents_dir, provider, max_retries=2) as gateway:
        events = await run_and_check(gateway, logs)
    assert kinds(events)[-1] == "run.complete"
    retries = llm_lines(logs, "llm.retry")
    assert len(retries) == 2
    assert retries[0].endswith("error=provider 'fake': HTTP 503: overloaded, key ***")
    assert retries[1].endswith("error=provider 'fake': HTTP 429: slow down ***")


@pytest.mark.parametrize("where", [480, 490, 495, 499, 500])
async def test_an_error_body_cut_near_the_key(
    agents_dir: Path, provider: LoopbackProvider, logs: pytest.LogCaptureFixture, where: int
) -> None:
    text = "x" * where + KEY + "y" * 600
    provider.enqueue([HttpError(500, text)], [HttpError(400, {"error": {"message": text}})])
    async with gateway_with(agents_dir, provider) as gateway:
        as_text = await run_and_check(gateway, logs)
        as_json = await run_and_check(gateway, logs)
    kept = ("x" * where + "***" + "y" * 600)[:500] + "…"
    assert message(as_text) == f"provider 'fake': HTTP 500: {kept}"
    assert message(as_json) == f"provider 'fake': HTTP 400: {kept}"


async def test_a_key_the_provider_cut_itself(
    agents_dir: Path, provider: LoopbackProvider, logs: pytest.LogCaptureFixture
) -> None:
    provider.enqueue([HttpError(401, {"error": {"message": f"bad key {KEY[:12]}"}})])
    async with gateway_with(agents_dir, provider) as gateway:
        events = await run_and_check(gateway, logs)
    assert message(events) == "provider 'fake': HTTP 401: bad key ***"


async def test_a_stream_error_and_a_bad_chunk_echoing_the_key(
    agents_dir: Path, provider: LoopbackProvider, logs: pytest.LogCaptureFixture
) -> None:
    provider.enqueue(
        [content("a"), error_chunk(f"key {KEY} revoked"), DONE],
        [content("a"), f"data: {{oops {SUBSCRIPTION}\n\n".encode(), DONE],
    )
    async with gateway_with(agents_dir, provider) as gateway:
        stream_error = await run_and_check(gateway, logs)
        bad_chunk = await run_and_check(gateway, logs)
    assert message(stream_error) == "provider 'fake': stream error: key *** revoked"
    assert message(bad_chunk) == "provider 'fake': invalid JSON in stream: '{oops ***'"


async def test_content_echoing_a_secret_is_masked_in_the_interaction_log(
    agents_dir: Path, provider: LoopbackProvider, logs: pytest.LogCaptureFixture
) -> None:
    provider.enqueue([content(f"your org is {ORG}"), finish("stop"), DONE])
    async with gateway_with(agents_dir, provider) as gateway:
        events = await gateway.query("plain", "hi")
    assert [e.content_delta.delta for e in events if e.type == "content.delta"] == [
        f"your org is {ORG}"  # the answer itself is the model's, relayed as is
    ]
    assert ORG[:4] not in logs.text
    assert any("content='your org is ***'" in line for line in llm_lines(logs, "llm.delta"))


def test_secret_mask_by_value() -> None:
    mask = SecretMask(["abcdefgh", "abc", "", "abcdefghij"])  # "abc" is too short to mask
    assert mask("x abcdefghij y abcdefgh z abc") == "x *** y *** z abc"
    assert mask("cut at abcdefg") == "cut at ***"  # a secret the producer cut
    assert mask("cut at abc") == "cut at abc"  # 3 characters are not a secret
    assert mask.clip("0123456789abcdefgh", 12) == "0123456789**…"
    assert mask.clip("0123abcd" + "z" * 20, 8) == "0123***…"  # a fragment at the cut
    assert not SecretMask(["", "ab"])
