"""Fuzz: the AG-UI endpoint (`POST /api/ag-ui/{agentKey}`), registered by hand, not from the proto.

One service for the module (see kit.py). Generated `RunAgentInput`s (agui_inputs.py:
valid, near-valid, hostile) and raw bytes, by alice, bob or no one, to every agent
key and junk ones: never a 5xx; a refusal is the error envelope; a stream keeps
AG-UI's rules. Runs left waiting on a frontend tool or an ask are answered by later
examples, or cancelled when too many wait. Last, once every run has ended: nothing
leaked, nothing written outside, nothing logged at ERROR.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from tests.fuzz import agui_inputs
from tests.fuzz.endpoints import CALLERS, post, to_json, trim
from tests.fuzz.guards import assert_no_leaks
from tests.fuzz.kit import AGENT_KEYS, ASKING_AGENTS, FuzzService, forget_runs, fuzz, settle
from tests.fuzz.protos import strings

pytestmark = pytest.mark.asyncio(loop_scope="module")

SERVICE_SETTINGS = {"http_max_body_bytes": 256 * 1024, "agents": ASKING_AGENTS}
CONTENT_TYPES = ("application/json", "application/json", "text/plain", "application/x+json")

keys = st.sampled_from((*AGENT_KEYS, *ASKING_AGENTS)) | strings().map(lambda s: quote(s, safe=""))


def headers(caller: str | None, content_type: str) -> list[tuple[str, str]]:
    out = [("Content-Type", content_type)]
    return out + ([("Authorization", caller)] if caller is not None else [])


@fuzz(120)
@given(data=st.data())
async def test_run_inputs(service: FuzzService, data: st.DataObject) -> None:
    trim(service)
    body, caller = data.draw(agui_inputs.inputs(service), label="body")
    agents = st.sampled_from(["react", "react", "guarded", "gated", "plan", "oneshot"])
    key = data.draw(
        st.sampled_from([False] * 5 + [True]).flatmap(lambda odd: keys if odd else agents),
        label="agent",
    )
    answer = await post(
        service, f"/api/ag-ui/{key}", to_json(body), headers(caller, "application/json")
    )
    assert answer is not None, "no answer"
    agui_inputs.check(answer)
    agui_inputs.note(service, body, caller, answer)
    event(agui_inputs.outcome(answer))


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
    answer = await post(service, f"/api/ag-ui/{key}", body, headers(caller, content_type))
    if answer is not None:
        agui_inputs.check(answer)


async def test_nothing_leaked_and_nothing_written_outside(service: FuzzService) -> None:
    await settle(service)
    await assert_no_leaks(service)
    service.guard.check()
    await forget_runs(service)
    service.alarms.check()
