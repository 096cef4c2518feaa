"""An in-process model: scripted turns played through the model port, without sockets.

`ScriptedModel` implements `ModelClient`. Each `stream` call takes the next
queued turn and plays it item by item, like a provider's stream: a `ModelDelta`
is yielded as it is (one per iteration, nothing merged or split), `Pause` waits,
`Gate` waits for its event, `fail(...)` raises the provider's stream error where
it stands (any exception instance is raised as it is), `DONE` ends the turn.
Chunk dicts built with the loopback helpers (`service.providers.loopback.content`
and friends) are accepted too and go through the real wire parser, so one script
can drive either fake.

Every call is recorded as a `ScriptedCall`: its `ModelRequest`, how many deltas
it delivered, whether the turn was played to its end and whether the stream was
closed (always, once the caller leaves the `async with` block, by any way).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeAlias

from service.core.errors import ProviderError, ProviderStreamError
from service.core.model import ModelDelta, ModelRequest, ToolCallDelta, Usage
from service.providers.loopback import DONE, Gate, Pause
from service.providers.openai_wire import parse_chunk

#: A turn: ModelDelta, loopback chunk dict, Pause, Gate, StreamError, exception or DONE items.
Turn: TypeAlias = Iterable[object]


@dataclass(frozen=True, slots=True)
class StreamError:
    """The provider reports an error in the middle of its stream."""

    message: str


@dataclass(slots=True)
class ScriptedCall:
    """One call of the model: what it was asked and how its stream went."""

    request: ModelRequest
    deltas: int = 0  # deltas delivered to the caller
    finished: bool = False  # the turn was played to its end
    closed: bool = False  # the caller left the stream's block


class ScriptedModel:
    """A `ModelClient` playing queued turns, one turn per call, in order."""

    def __init__(self, key: str = "scripted") -> None:
        self.key = key
        self.calls: list[ScriptedCall] = []
        self.client_closed = False
        self._turns: deque[Turn] = deque()

    def enqueue(self, *turns: Turn) -> None:
        """Queue turns for the next calls, one turn per call."""
        self._turns.extend(turns)

    @property
    def requests(self) -> list[ModelRequest]:
        """The requests received, in order."""
        return [call.request for call in self.calls]

    @property
    def pending(self) -> int:
        """Turns queued and not yet played."""
        return len(self._turns)

    @asynccontextmanager
    async def stream(self, request: ModelRequest) -> AsyncIterator[AsyncIterator[ModelDelta]]:
        """Open a call: record it and iterate the next queued turn inside the block."""
        call = ScriptedCall(request)
        self.calls.append(call)
        if not self._turns:
            call.closed = True
            raise ProviderError(self.key, "no turn queued for this request", status=500)
        deltas = self._play(self._turns.popleft(), call)
        try:
            yield deltas
        finally:
            call.closed = True
            await deltas.aclose()

    async def aclose(self) -> None:
        self.client_closed = True

    async def _play(self, turn: Turn, call: ScriptedCall) -> AsyncGenerator[ModelDelta, None]:
        for item in turn:
            if isinstance(item, ModelDelta):
                delta: ModelDelta | None = item
            elif isinstance(item, dict):  # a loopback chunk: parsed as a provider's would be
                delta = parse_chunk(self.key, json.dumps(item, ensure_ascii=False))
            elif isinstance(item, Pause):
                await asyncio.sleep(item.seconds)
                continue
            elif isinstance(item, Gate):
                await item.event.wait()
                continue
            elif isinstance(item, StreamError):
                raise ProviderStreamError(self.key, f"stream error: {item.message}")
            elif isinstance(item, BaseException):
                raise item
            elif item is DONE:
                break
            else:
                raise TypeError(f"not an item of a scripted turn: {item!r}")
            if delta is not None:
                call.deltas += 1
                yield delta
        call.finished = True


# -- builders (the same names and arguments as the loopback chunk builders) --------------


def content(text: str) -> ModelDelta:
    return ModelDelta(content=text)


def reasoning(text: str) -> ModelDelta:
    return ModelDelta(reasoning=text)


def tool_call_part(
    index: int, id: str | None = None, name: str | None = None, arguments: str = ""
) -> ToolCallDelta:
    """One fragment of a tool call (for `tool_calls(...)` with several calls)."""
    return ToolCallDelta(index, id, name, arguments)


def tool_call(
    index: int, id: str | None = None, name: str | None = None, arguments: str = ""
) -> ModelDelta:
    return ModelDelta(tool_calls=(ToolCallDelta(index, id, name, arguments),))


def tool_calls(*parts: ToolCallDelta) -> ModelDelta:
    """One delta carrying several tool-call fragments (parallel calls)."""
    return ModelDelta(tool_calls=parts)


def finish(reason: str) -> ModelDelta:
    return ModelDelta(finish_reason=reason)


def usage(prompt: int, completion: int, reasoning_tokens: int = 0) -> ModelDelta:
    return ModelDelta(
        usage=Usage(prompt, completion, prompt + completion, reasoning_tokens=reasoning_tokens)
    )


def fail(message: str) -> StreamError:
    """An error chunk: the call fails there, as `loopback.error_chunk` makes a provider's fail."""
    return StreamError(message)
