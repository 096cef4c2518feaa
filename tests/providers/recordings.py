"""The recorded provider answers in fixtures/ (see its README), as loopback provider scripts.

A recorded body is replayed event by event, each event one write of its bytes exactly as
recorded (separators, padding and all), as a provider streams them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures"

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


def events(name: str) -> list[bytes]:
    """The events of a recorded SSE body, each with its terminating blank line."""
    raw = (FIXTURES / name).read_bytes()
    out: list[bytes] = []
    start = 0
    for match in _EVENT_END.finditer(raw):
        out.append(raw[start : match.end()])
        start = match.end()
    if raw[start:].strip():
        out.append(raw[start:])
    return out


def as_event(name: str) -> bytes:
    """A recorded JSON answer (`GenerateContentResponse`) as the one event of a stream."""
    return b"data: " + json.dumps(json.loads((FIXTURES / name).read_text())).encode() + b"\r\n\r\n"


def data_of(chunks: list[bytes]) -> list[dict[str, Any]]:
    """The JSON data of each event (read here with the standard library only, for the
    expectations: independent of the parsers under test)."""
    out = []
    for chunk in chunks:
        lines = chunk.decode().replace("\r\n", "\n").split("\n")
        data = "\n".join(line[5:].lstrip(" ") for line in lines if line.startswith("data:"))
        if data:
            out.append(json.loads(data))
    return out


def request_of(name: str) -> dict[str, Any]:
    """A recorded request body."""
    value: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return value
