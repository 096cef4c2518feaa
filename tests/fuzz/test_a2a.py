"""Fuzz: the A2A endpoint (`/a2a/{agentKey}`), registered by hand, not from the proto.

One service for the module (see kit.py). JSON-RPC requests of every method in
both dialects with generated params (a2a_requests.py), raw bytes, and card
fetches with odd agent keys, by alice, bob or no one: never a 5xx nor an internal
error; JSON-RPC answers carry the request's id; a stream's error comes last. Tasks
left input-required are answered by later examples, or cancelled when too many
wait. Last, once every run has ended: nothing leaked, nothing written outside,
nothing logged at ERROR.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from tests.fuzz import a2a_requests
from tests.fuzz.endpoints import CALLERS, post, to_json, trim
from tests.fuzz.guards import assert_no_leaks
from tests.fuzz.kit import AGENT_KEYS, ASKING_AGENTS, FuzzService, forget_runs, fuzz, settle
from tests.fuzz.protos import strings

pytestmark = pytest.mark.asyncio(loop_scope="module")

SERVICE_SETTINGS = {"http_max_body_bytes": 256 * 1024, "agents": ASKING_AGENTS}
CONTENT_TYPES = ("application/json", "application/json", "text/plain", "application/a2a+json")
VERSIONS = (None, None, None, None, None, "1.0", "0.3", "0.2", "x")

keys = st.sampled_from((*AGENT_KEYS, *ASKING_AGENTS)) | strings().map(lambda s: quote(s, safe=""))


def headers(caller: str | None, content_type: str, version: str | None) -> list[tuple[str, str]]:
    out = [("Content-Type", content_type)]
    out += [("Authorization", caller)] if caller is not None else []
    return out + ([("A2A-Version", version)] if version is not None else [])


@fuzz(120)
@given(data=st.data())
async def test_json_rpc_calls(service: FuzzService, data: st.DataObject) -> None:
    trim(service)
    body, caller = data.draw(a2a_requests.calls(service), label="body")
    agents = st.sampled_from(["react", "react", "guarded", "gated", "oneshot", "sh"])
    key = data.draw(
        st.sampled_from([False] * 5 + [True]).flatmap(lambda odd: keys if odd else agents),
        label="agent",
    )
    version = data.draw(st.sampled_from(VERSIONS), label="A2A-Version")
    answer = await post(
        service, f"/a2a/{key}", to_json(body), headers(caller, "application/json", version)
    )
    assert answer is not None, "no answer"
    a2a_requests.check(body, answer)
    a2a_requests.note(service, caller, answer)
    event(a2a_requests.outcome(answer))


@fuzz(15)
@given(
    body=st.binary(max_size=200) | st.sampled_from([b"", b"{", b"[]", b"null", b"x" * 300_000]),
    key=keys,
    caller=st.sampled_from(CALLERS),
    content_type=st.sampled_from(CONTENT_TYPES),
)
async def test_raw_bodies(
    service: FuzzService, body: bytes, key: str, caller: str | None, content_type: str
) -> None:
    answer = await post(service, f"/a2a/{key}", body, headers(caller, content_type, None))
    if answer is not None:
        a2a_requests.check(None, answer)


@fuzz(20)
@given(
    key=keys | st.sampled_from(["..", "%2e%2e", "a%2Fb", "%00", "x" * 3000]),
    caller=st.sampled_from(CALLERS),
)
async def test_cards(service: FuzzService, key: str, caller: str | None) -> None:
    path = f"/a2a/{key}/.well-known/agent-card.json"
    answer = await post(service, path, b"", headers(caller, "application/json", None), "GET")
    if answer is None:
        return
    assert answer.status < 500, (answer.status, answer.body[:300])
    if answer.status == 200:
        card = answer.json()
        assert card["name"] and card["supportedInterfaces"], card


async def test_nothing_leaked_and_nothing_written_outside(service: FuzzService) -> None:
    await settle(service)
    await assert_no_leaks(service)
    service.guard.check()
    await forget_runs(service)
    service.alarms.check()
