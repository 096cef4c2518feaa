"""The fuzzed service, the ids it hands out, and what must hold after fuzzing it.

`fuzz_service` starts the whole service (gRPC, the HTTP adapter, the real
tools and sandbox) on loopback, with authentication on (two API keys and an
HMAC JWT secret), a loopback model that answers every call without a script
(the demo model's decisions; the `_bash_` agent runs the user's message as its
command), and agents of every mode, with frontend, action and backend tools.
Every directory it may write lies under its root, a few levels below the test's
temporary directory, so that an escape by `..` lands where `FileGuard` looks.

`fuzz(n)` are the Hypothesis settings of every fuzz test: `n` examples, no
deadline, derandomized (the same examples on every run, for CI) unless
`AGW_FUZZ_SEED` names a seed to explore with instead; `AGW_FUZZ_SCALE` multiplies
the examples (a longer hunt: `AGW_FUZZ_SEED=7 AGW_FUZZ_SCALE=10 pytest tests/fuzz`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import jwt
from agw.v1 import events_pb2 as pb
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st

from service.assembly.config import ApiKeySettings
from service.providers import loopback as lb
from service.providers.demo import demo_responder
from service.providers.loopback import LoopbackProvider
from service.testing import Harness, write_agent
from tests.core.tools.kit import agent, tools, write_ui_tools
from tests.fuzz.guards import MARKER, Alarms, FileGuard

T = TypeVar("T")

SEED = os.environ.get("AGW_FUZZ_SEED")
SCALE = float(os.environ.get("AGW_FUZZ_SCALE", "1"))

#: Status codes that say the service did not foresee a request.
FORBIDDEN_CODES = frozenset(
    {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS}
)
#: The longest status message (UTF-8 bytes) or response detail the service may send.
MAX_MESSAGE_BYTES = 1200
#: How long any one fuzzed call may take before it counts as hung.
CALL_TIMEOUT_S = 20.0

ALICE_KEY = "fuzz-key-alice-" + "a" * 24
BOB_KEY = "fuzz-key-bob-" + "b" * 24
JWT_SECRET = "fuzz-jwt-secret-" + "s" * 32
CREDENTIALS: dict[str, str] = {"alice": ALICE_KEY, "bob": BOB_KEY}

#: The agents, by key: every mode, every kind of tool, and agents that cannot run.
AGENTS: dict[str, dict[str, Any]] = {
    "oneshot": agent(modelConfig={"reasoning": {"enabled": True}}),
    "slow": agent(prompt="Answer slowly."),
    "react": agent(
        "REACT",
        toolConfig=tools("city_datetime", frontends=("pick",), actions=("theme",)),
        budget={"maxModelCalls": 8, "maxToolCalls": 6, "maxSteps": 6, "timeoutMs": 20000},
    ),
    "plan": agent("PLAN_EXECUTE", toolConfig=tools("city_datetime")),
    "sh": agent(toolConfig=tools("_bash_")),
    "ghost_provider": agent(modelConfig={"providerKey": "nowhere"}),
    "ghost_tool": agent(toolConfig=tools("no_such_tool")),
}
AGENT_KEYS = (*AGENTS, "broken", "missing")
#: Agents whose runs wait for the user's permission or plan approval (for the fuzz tests
#: that answer them: `fuzz_service(..., agents=ASKING_AGENTS)`).
ASKING_AGENTS: dict[str, dict[str, Any]] = {
    "guarded": agent(
        "REACT", toolConfig=tools("city_datetime"), toolPermissions={"city_datetime": "ASK"}
    ),
    "gated": agent(
        "PLAN_EXECUTE",
        toolConfig=tools("city_datetime"),
        planExecute={"plan": {"systemPrompt": "Plan.", "approval": True}},
    ),
}

#: Commands the `sh` agent runs: ordinary ones, and attempts to write outside the workspace.
COMMANDS = (
    "echo hi > note.txt && cat note.txt",
    f"touch /tmp/{MARKER}-1",
    f"echo x > ../../{MARKER}-2",
    f"cd / && touch {MARKER}-3; cd ~ && touch {MARKER}-4",
    f"ln -s / root; echo x > root/tmp/{MARKER}-5",
    f"mkdir -p ../../../{MARKER}-6",
    f"cp /etc/hostname $OLDPWD/{MARKER}-7; echo > /dev/shm/{MARKER}-8",
    "ls -la / ..; cat /proc/1/environ",
)


#: Paths of a chat's workspace to read (DownloadFile): what the commands above write, and
#: ways out of it.
WORKSPACE_PATHS = (
    "note.txt",
    "root",
    "root/etc/passwd",
    "../../etc/passwd",
    "/etc/passwd",
    ".git/config",
    "note.txt/..",
    "",
)


def fuzz(max_examples: int) -> Callable[[T], T]:
    """The settings of a fuzz test (see the module docstring)."""

    def decorate(test: T) -> T:
        configured = settings(
            max_examples=max(1, round(max_examples * SCALE)),
            deadline=None,
            derandomize=SEED is None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )(test)
        return seed(int(SEED))(configured) if SEED is not None else configured

    return decorate


def token(**claims: Any) -> str:
    """A JWT signed with the service's HMAC secret (claims as given)."""
    return jwt.encode(claims, JWT_SECRET, algorithm="HS256")


def tokens() -> list[str]:
    """Bearer tokens: a valid JWT of "carol", and broken, forged, expired and odd ones."""
    later = int(time.time()) + 3600
    forged = jwt.encode(
        {"sub": "alice", "exp": later}, "not-the-secret-" + "n" * 32, algorithm="HS256"
    )
    unsigned = base64.urlsafe_b64encode(b'{"alg":"none","typ":"JWT"}').rstrip(b"=").decode()
    claims = base64.urlsafe_b64encode(b'{"sub":"alice"}').rstrip(b"=").decode()
    return [
        token(sub="carol", tenant="t2", exp=later),
        token(sub="carol", exp=int(time.time()) - 3600),
        token(sub="", exp=later),
        token(sub="dave", tenant=["not", "a", "string"], exp=later),
        token(sub={"id": 1}, exp=later),
        token(exp=later),
        forged,
        f"{unsigned}.{claims}.",
        "a.b.c",
        "..",
    ]


def callers() -> st.SearchStrategy[tuple[tuple[str, str], ...]]:
    """The metadata of a call: a valid key three times in five, else a token, a bad header,
    or none; maybe a trace context or request id of any printable text."""
    printable = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)
    headers = st.one_of(
        st.sampled_from([f"Bearer {t}" for t in tokens()]),
        st.sampled_from(["", "Bearer", "Bearer ", "Basic YWxpY2U6eA==", f"bearer  {ALICE_KEY} "]),
        printable.map(lambda text: f"Bearer {text}"),
        printable,
        st.just(8000).map(lambda n: "Bearer " + "x" * n),
    )
    valid = st.sampled_from([FuzzService.metadata("alice")] * 3 + [FuzzService.metadata("bob")])
    invalid = headers.map(lambda header: (("authorization", header),)) | st.just(())
    credentials = st.sampled_from([True, True, True, False, False]).flatmap(
        lambda good: valid if good else invalid
    )
    extra = st.tuples(st.sampled_from(["traceparent", "x-request-id", "tracestate"]), printable)
    others = st.lists(extra, max_size=2).map(tuple)
    return st.tuples(credentials, others).map(lambda both: (*both[0], *both[1]))


# The model ---------------------------------------------------------------------------


def responder() -> lb.Responder:
    """The demo model's answers; slower for "slowly" agents; `_bash_` runs the user's text."""
    fast, paced = demo_responder(0), demo_responder(0.01)

    def respond(body: dict[str, Any]) -> list[lb.ScriptItem]:
        messages = body.get("messages") or []
        system = str(messages[0].get("content")) if messages else ""
        offered = {t.get("function", {}).get("name") for t in body.get("tools") or []}
        if "_bash_" in offered and messages and messages[-1].get("role") == "user":
            command = _text(messages[-1].get("content")) or "true"
            arguments = json.dumps({"command": command})
            return [
                lb.tool_call(0, "call_" + secrets.token_hex(6), "_bash_", arguments),
                lb.finish("tool_calls"),
                lb.DONE,
            ]
        return list((paced if "slowly" in system else fast)(body))  # type: ignore[arg-type]

    return respond


def _text(content: Any) -> str:
    """The text of a message's content (a string, or a list of parts)."""
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


# Ids seen while fuzzing --------------------------------------------------------------

Bend = Callable[[str], str]
#: How an id is bent on its way: kept (mostly), or a newline, a traversal, a case, a cut.
BENDS: tuple[Bend, ...] = (
    *[lambda s: s] * 4,
    lambda s: s + "\n",
    lambda s: "../" + s,
    lambda s: s.upper(),
    lambda s: s[:-1],
    lambda s: s + "/../../x",
)


@dataclass
class Ids:
    """The ids the service handed out, for requests that aim at real chats, runs and tools."""

    chats: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    uploads: list[str] = field(default_factory=list)
    #: What runs left waiting named, for answers: (Authorization, kind, chat or task, wait ids).
    waits: list[tuple[str, str, str, list[str]]] = field(default_factory=list)

    LIMIT = 64

    def note(self, event: pb.Event) -> None:
        self.add("chats", event.chat_id)
        self.add("runs", event.run_id)
        if event.WhichOneof("payload") == "tool_end":
            self.add("tools", event.tool_end.tool_id)

    def wait(self, caller: str, kind: str, owner: str, waits: list[str]) -> None:
        """Keep what a run of `caller` left waiting: its chat or task `owner` waits for
        `waits` (of `kind`: "tool" calls, "interrupt"s, a "task"'s input)."""
        self.waits.append((caller, kind, owner, waits))
        del self.waits[: -self.LIMIT]

    def add(self, kind: str, value: str) -> None:
        """Keep `value` among the ids of `kind` (the last `LIMIT` of each)."""
        pool: list[str] = getattr(self, kind)
        if value and value not in pool:
            pool.append(value)
            del pool[: -self.LIMIT]

    def values(self, kind: str) -> st.SearchStrategy[str]:
        """One of the ids of `kind` seen so far (empty before the first), sometimes bent."""
        pool: list[str] = getattr(self, kind)
        picked = st.integers(0, 2**16).map(lambda i: pool[i % len(pool)] if pool else "")
        return st.tuples(picked, st.sampled_from(BENDS)).map(lambda pair: pair[1](pair[0]))


# The service -------------------------------------------------------------------------


@dataclass
class FuzzService:
    """The running service under fuzz, its model, its root directory and the ids seen."""

    harness: Harness
    provider: LoopbackProvider
    guard: FileGuard
    alarms: Alarms
    ids: Ids = field(default_factory=Ids)

    @property
    def app(self) -> Any:
        return self.harness.app

    @staticmethod
    def metadata(who: str) -> tuple[tuple[str, str], ...]:
        """The call metadata of `who` ("alice", "bob"), or `who` itself as the header."""
        token = CREDENTIALS.get(who, who)
        return (("authorization", f"Bearer {token}"),) if token else ()


@asynccontextmanager
async def fuzz_service(base: Path, **overrides: Any) -> AsyncIterator[FuzzService]:
    """The service of the fuzz tests under `base` (see the module docstring); `agents` in
    `overrides` are more agents (by key) beside `AGENTS`."""
    guard = FileGuard(base)
    dirs = guard.dirs
    for key, definition in {**AGENTS, **overrides.pop("agents", {})}.items():
        write_agent(dirs["agents"], key, definition)
    (dirs["agents"] / "broken.json").write_text('{"mode": "ONESHOT", "plain": ')
    write_ui_tools(dirs["tools"])
    dirs["workspace"].mkdir(parents=True)
    settings: dict[str, Any] = {
        "tools_dir": dirs["tools"],
        "data_dir": dirs["data"],
        "bash_working_dir": dirs["workspace"],
        "bash_timeout_s": 5.0,
        "frontend_wait_timeout_s": 60.0,  # every wait is answered or cancelled
        "max_concurrent_runs": 16,
        "auth_api_keys": [
            ApiKeySettings(key=ALICE_KEY, tenant="t1", subject="alice"),
            ApiKeySettings(key=BOB_KEY, tenant="t1", subject="bob", roles=["admin"]),
        ],
        "agent_store": "memory",  # the agent store's calls reach a store (bob may write)
        "auth_jwt_secret": JWT_SECRET,
        # webhooks and A2A push configurations to loopback (a closed port) are accepted:
        # their notifications are queued and their delivery fails, again and again
        "webhook_allowed_hosts": ["127.0.0.1"],
        "webhook_secret": "fuzz-secret",
        **overrides,
    }
    with Alarms.raised() as alarms:
        async with (
            LoopbackProvider(responder()) as provider,
            Harness.start(dirs["agents"], provider, **settings) as harness,
        ):
            service = FuzzService(harness, provider, guard, alarms)
            try:
                yield service
            finally:
                await settle(service)


async def settle(service: FuzzService, timeout_s: float = 15.0) -> None:
    """Cancel what still runs and wait until every run has ended and been kept."""
    front = service.app.frontdoor
    for run in list(front.runs.values()):
        if not run.done:
            run.cancel("fuzz over")
    async with asyncio.timeout(timeout_s):
        for run in list(front.runs.values()):
            await run.ended()
        await front.flush()


async def forget_runs(service: FuzzService) -> None:
    """Drop the ended runs kept for re-attach (and with them, what their tasks hold)."""
    bus = service.app.bus
    for run_id in list(bus.local_runs()):
        await bus.release(run_id)
