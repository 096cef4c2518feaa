"""What the fuzz tests of the hand-registered endpoints (AG-UI, A2A) share.

`post` sends a body as it is and reads the answer whole: the JSON body, or
every `data:` line of an SSE stream parsed as JSON (comments skipped, every
line checked to be SSE). `trim` keeps the runs the fuzzing leaves waiting (an
AG-UI run ended on a frontend tool, an A2A task input-required) few: the
oldest are cancelled, so that later examples can still answer the newest and
the service's run limit is not reached. `to_json` writes the generated bodies,
NaN and deep nesting included (the encoder a hostile client may use).
"""

from __future__ import annotations

import asyncio
import io
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from tests.fuzz.kit import ALICE_KEY, BOB_KEY, CALL_TIMEOUT_S, FuzzService

#: The Authorization headers a fuzzed request may carry: alice, bob, junk, none.
CALLERS: tuple[str | None, ...] = (
    f"Bearer {ALICE_KEY}",
    f"Bearer {ALICE_KEY}",
    f"Bearer {ALICE_KEY}",
    f"Bearer {BOB_KEY}",
    "Bearer nope",
    "Basic YWxpY2U6eA==",
    None,
)
#: How many runs may be left waiting for an answer at once.
WAITING_RUNS = 4


@dataclass
class Answer:
    """An HTTP answer: status, content type, body (JSON) or the SSE data (parsed)."""

    status: int
    content_type: str
    body: bytes = b""
    events: list[Any] = field(default_factory=list)

    @property
    def is_stream(self) -> bool:
        return self.content_type.startswith("text/event-stream")

    def json(self) -> Any:
        return orjson.loads(self.body)


def to_json(value: Any) -> bytes:
    """`value` as JSON text, NaN and infinities as the non-standard literals."""
    return json.dumps(value, allow_nan=True).encode()


async def post(
    service: FuzzService,
    path: str,
    body: bytes,
    headers: list[tuple[str, str]],
    method: str = "POST",
) -> Answer | None:
    """Send the request as it is (the path already encoded); None when the connection
    was closed before an answer (a body refused while it was still being sent)."""
    url = service.harness.http_url + path
    connector = aiohttp.TCPConnector(force_close=True)
    try:
        async with (
            aiohttp.ClientSession(connector=connector, skip_auto_headers=("User-Agent",)) as http,
            asyncio.timeout(CALL_TIMEOUT_S),
            http.request(
                method,
                aiohttp.client.URL(url, encoded=True),
                data=io.BytesIO(body) if method == "POST" else None,  # large bodies too
                headers=headers,
            ) as response,
        ):
            answer = Answer(response.status, response.headers.get("Content-Type", ""))
            if answer.is_stream:
                answer.events = await _events(response)
            else:
                answer.body = await response.read()
            return answer
    except aiohttp.ClientError:
        return None


async def _events(response: aiohttp.ClientResponse) -> list[Any]:
    """The JSON of every `data:` line; comments skipped; anything else fails the test."""
    events: list[Any] = []
    pending = False
    async for raw in response.content:
        line = raw.decode()
        assert line.endswith("\n"), f"an SSE line without its end: {line!r}"
        line = line[:-1]
        if not line:
            pending = False
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(": ")
        assert colon and name == "data", f"not a data line: {line!r}"
        assert not pending, "two data lines in one SSE message"
        events.append(orjson.loads(value))
        pending = True
    assert not pending, "an SSE message without its blank line"
    return events


def trim(service: FuzzService, keep: int = WAITING_RUNS) -> None:
    """Cancel the oldest runs still going, leaving `keep` of them (they wait for answers)."""
    live = [run for run in service.app.frontdoor.runs.values() if not run.done]
    for run in live[: max(0, len(live) - keep)]:
        run.cancel("fuzz: too many waiting runs")
