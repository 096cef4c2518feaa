"""A run as Redis holds it, read back: its meta hash and the events of its stream.

The meta hash (`scripts.Keys.meta`) says whose the run is (chat, owner principal,
owner replica), how it stands (`running`, `lost`, `ended`), under which fence, and
what it waits for; the stream's entries hold the serialized `agw.v1.Event`s, the
last of a run that ended being its terminal event (`is_terminal`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson

from service.core.events import TERMINALS, Event
from service.core.ids import Principal, valid_run_id
from service.core.values import WAIT_KINDS, OpenWait, RunRef, WaitKind
from service.state.redis.link import Link
from service.state.redis.scripts import ENDED


def text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


def open_waits(data: bytes | None) -> list[OpenWait]:
    """The open waits a meta hash holds (`[[tool id, kind, tool name], ...]`)."""
    waits = orjson.loads(data) if data else []
    return [
        OpenWait(tool_id, cast(WaitKind, kind), name)
        for tool_id, kind, name in waits
        if kind in WAIT_KINDS  # a kind this version does not know is left out
    ]


def waits_json(waits: Sequence[OpenWait]) -> bytes:
    """Open waits as a meta hash keeps them (`open_waits` reads them back)."""
    return orjson.dumps([[w.tool_id, w.kind, w.tool_name] for w in waits])


def events_of(entries: Any) -> list[Event]:
    """The events of stream entries (`[(id, {b"e": data})]`)."""
    return [Event.FromString(fields[b"e"]) for _entry_id, fields in entries]


def is_terminal(event: Event) -> bool:
    return event.WhichOneof("payload") in TERMINALS


@dataclass(frozen=True, slots=True)
class Meta:
    """A run as its meta hash describes it."""

    run_id: str
    chat_id: str
    owner: Principal
    replica: str
    status: str

    @property
    def ref(self) -> RunRef:
        return RunRef(self.run_id, self.chat_id, self.owner, running=self.status != ENDED)


async def read_meta(link: Link, run_id: str) -> Meta | None:
    """The run's meta hash; None when there is none (or the id is not a run id)."""
    if not valid_run_id(run_id):
        return None
    data = await link.redis.hgetall(link.keys.meta(run_id))
    if not data:
        return None
    fields = {text(k): text(v) for k, v in data.items()}
    return Meta(
        run_id,
        fields.get("chat", ""),
        Principal(fields.get("tenant", ""), fields.get("subject", "")),
        fields.get("replica", ""),
        fields.get("status", ""),
    )
