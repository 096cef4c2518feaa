"""A run's opening behind its first model request: real gRPC server, real HTTP client, and a
fake provider in a thread of its own (it answers whatever the service's loop is doing).

The run's task sends its first model request before the run's opening is journaled or
written to the stream: the service's loop is blocked, in the journal's write of the
run's first batch and in the stream's first write, until the provider has the request
(it would wait for nothing if the request came after them). The stream is as it was —
its opening events first, then the model's — and a failure of the opening work (its
chat's record not stored) ends the run precisely and closes the request under way.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw

from service.core.errors import StoreFailed
from service.core.run.journal import JournalEntry
from service.providers.loopback import DONE, Gate, LoopbackProvider, Pause, content, finish
from service.state.files.chats import JsonlChatStore
from service.state.files.journal import FileRunJournal
from service.testing import Harness
from service.transport.heartbeat import StreamWriter
from tests.transport.test_chat_lifecycle import RUN

WAIT_S = 5.0  # how long the blocked loop waits for the provider: a test that fails, fails slowly


async def warm_up(gateway: Harness, upstream: ThreadedProvider) -> None:
    """One run first, to its end: the HTTP client's pool then holds a connection to the
    provider, as it does once a service has served (the first request waits for a connect)."""
    call = gateway.stub.Query(gw.QueryRequest(agent_key="plain", message="Warm up"))
    async for event in call:
        if event.type == "run.start":  # (its request may still be on its way: a new connection)
            assert await asyncio.to_thread(upstream.received.wait, WAIT_S)
            upstream.open_gate()
    upstream.received.clear()


class ThreadedProvider:
    """A `LoopbackProvider` on an event loop of its own, in a thread: it receives a request
    whatever the service's loop does, and says when (`received`)."""

    def __init__(self, script: Callable[[asyncio.Event], list[Any]]) -> None:
        self.script = script
        self.received = threading.Event()
        self.received_at = 0.0  # time.monotonic() of the first request
        self.release: asyncio.Event | None = None  # of the provider's loop, per request
        self.loop = asyncio.new_event_loop()
        self.provider = LoopbackProvider(self._respond)

    def _respond(self, _body: dict[str, Any]) -> list[Any]:
        self.received_at = time.monotonic()
        self.received.set()
        self.release = asyncio.Event()
        return self.script(self.release)

    def open_gate(self) -> None:
        """Let the request being answered go on (from any thread)."""
        release = self.release
        assert release is not None
        self.loop.call_soon_threadsafe(release.set)

    def call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(WAIT_S)

    @contextmanager
    def running(self) -> Iterator[LoopbackProvider]:
        thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        thread.start()
        try:
            self.call(self.provider.start())
            yield self.provider
        finally:
            try:
                self.call(self.provider.stop())
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                thread.join(WAIT_S)
                self.loop.close()


def held_at_run_start(release: asyncio.Event) -> list[Any]:
    """The first token waits until the test opens the gate (once its client saw run.start)."""
    return [Gate(release), content("Hi"), finish("stop"), DONE]


def held_until_released(release: asyncio.Event) -> list[Any]:
    """The answer's head at once, its first token when the test opens the gate: a request
    under way, whose closing the provider sees."""
    return [Pause(0.0), Gate(release), content("Hi"), finish("stop"), DONE]


@pytest.fixture
def blocked_until_requested(monkeypatch: pytest.MonkeyPatch) -> Callable[[ThreadedProvider], dict]:
    """Block the service's loop at the journal's first write of a run's begin record and at
    the first write of each stream, until the provider has the request; say whether it had."""

    def install(upstream: ThreadedProvider) -> dict[str, bool]:
        """From now on."""
        seen: dict[str, bool] = {}
        write_now = FileRunJournal.write_now
        write = StreamWriter.write

        def journal_write_now(self: FileRunJournal, entries: list[JournalEntry]) -> bool:
            if "journal" not in seen and any(e.kind == "begin" for e in entries):
                seen["journal"] = upstream.received.wait(WAIT_S)
            return write_now(self, entries)

        async def stream_write(self: StreamWriter, event: pb.Event) -> None:
            if "stream" not in seen:
                seen["stream"] = upstream.received.wait(WAIT_S)
            await write(self, event)

        monkeypatch.setattr(FileRunJournal, "write_now", journal_write_now)
        monkeypatch.setattr(StreamWriter, "write", stream_write)
        return seen

    return install


@pytest.mark.parametrize("run_journal", ["files", "none"])
async def test_the_first_model_request_is_out_before_the_opening_is_journaled_or_written(
    agents_dir: Path,
    blocked_until_requested: Callable[[ThreadedProvider], dict],
    run_journal: str,
) -> None:
    upstream = ThreadedProvider(held_at_run_start)
    with upstream.running() as provider:
        async with Harness.start(agents_dir, provider, run_journal=run_journal) as gateway:
            await warm_up(gateway, upstream)
            seen = blocked_until_requested(upstream)
            started = time.monotonic()
            events: list[pb.Event] = []
            arrived: list[float] = []
            call = gateway.stub.Query(gw.QueryRequest(agent_key="plain", message="Hello"))
            async for event in call:
                events.append(event)
                arrived.append(time.monotonic())
                if event.type == "run.start":  # the provider held its first token till now
                    upstream.open_gate()
    expected = {"journal": True, "stream": True} if run_journal == "files" else {"stream": True}
    assert seen == expected
    assert [e.type for e in events] == RUN
    assert [e.seq for e in events] == list(range(1, 8))
    assert events[4].content_delta.delta == "Hi"
    assert started < upstream.received_at < arrived[0]  # before the client's first event


async def test_a_chat_store_failing_at_the_opening_ends_the_run_and_closes_its_request(
    agents_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    append = JsonlChatStore.append
    full = False

    async def failing_append(self: JsonlChatStore, chat_id: str, records: list) -> None:
        if full and any(r.get("_type") == "query" for r in records):
            raise StoreFailed(f"chat {chat_id!r}: no space left on the device")
        await append(self, chat_id, records)

    monkeypatch.setattr(JsonlChatStore, "append", failing_append)
    upstream = ThreadedProvider(held_until_released)
    with upstream.running() as provider:
        async with Harness.start(agents_dir, provider) as gateway:
            await warm_up(gateway, upstream)
            full = True
            tasks_before = len(asyncio.all_tasks())
            call = gateway.stub.Query(gw.QueryRequest(agent_key="plain", message="Hello"))
            events = [event async for event in call]
            assert upstream.received.is_set()  # the request was under way when it failed
            await asyncio.to_thread(upstream.call, provider.wait_disconnects(1, WAIT_S))
            await asyncio.to_thread(upstream.call, provider.wait_connections(0, WAIT_S))
            front = gateway.app.frontdoor
            await front.flush()
            await asyncio.sleep(0)  # the last done-callbacks
            assert front.active_runs == 0
            assert len(asyncio.all_tasks()) <= tasks_before
    assert [e.type for e in events] == ["request.query", "chat.start", "run.start", "run.error"]
    error = events[-1].run_error.error
    assert error.reason == "STORE_FAILED"
    assert "no space left on the device" in error.message


async def test_a_client_gone_during_the_opening_closes_the_request_under_way(
    agents_dir: Path,
) -> None:
    upstream = ThreadedProvider(held_until_released)
    with upstream.running() as provider:
        async with Harness.start(agents_dir, provider, disconnect_policy="cancel") as gateway:
            await warm_up(gateway, upstream)
            call = gateway.stub.Query(gw.QueryRequest(agent_key="plain", message="Hello"))
            first = await call.read()
            assert first.type == "request.query"
            run = gateway.app.frontdoor.runs[first.run_id]
            call.cancel()
            await asyncio.to_thread(upstream.call, provider.wait_disconnects(1, WAIT_S))
            await asyncio.to_thread(upstream.call, provider.wait_connections(0, WAIT_S))
            await asyncio.wait_for(run.wait(), WAIT_S)
            assert run.terminal is not None
            assert run.terminal.run_cancel.reason == "disconnect"
