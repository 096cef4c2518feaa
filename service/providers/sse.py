"""An incremental Server-Sent-Events parser (WHATWG "event stream" rules).

Bytes may arrive split anywhere, even inside a CRLF pair or a UTF-8 sequence.
Lines end with LF, CRLF or a lone CR; a blank line dispatches the event. The
parser works line by line with `bytes.split`, never byte by byte, because it
sits on the per-delta hot path; a chunk of whole one-line `data: ` events —
what providers send — takes a shorter path that yields the same events.

Deviation from the standard, on purpose: at end of stream, `flush()` treats an
unterminated last line as complete and dispatches a pending event instead of
discarding it (some servers omit the final blank line).

Memory is bounded: a line longer than `max_line_bytes` (default 1 MiB) or an
event whose data grows beyond `max_event_bytes` (default 4 MiB) sets the
parser's `error` (an `SSELimitExceeded`) as soon as the bytes that break the
limit arrive, so an unterminated line from a faulty or hostile server never
accumulates.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

_BOM = b"\xef\xbb\xbf"

DEFAULT_MAX_LINE_BYTES = 1024 * 1024
"""Longest line accepted (without its line ending)."""
DEFAULT_MAX_EVENT_BYTES = 4 * 1024 * 1024
"""Largest event accepted: its data lines, joined by LF."""

__all__ = [
    "DEFAULT_MAX_EVENT_BYTES",
    "DEFAULT_MAX_LINE_BYTES",
    "SSELimitExceeded",
    "SSEParser",
    "iter_sse",
]


class SSELimitExceeded(ValueError):
    """The stream broke one of the parser's size limits.

    `limit` is "line" or "event"; `max_bytes` is the limit that was exceeded.
    """

    def __init__(self, limit: str, max_bytes: int) -> None:
        what = "a line" if limit == "line" else "the data of an event"
        super().__init__(f"{what} exceeded {max_bytes} bytes")
        self.limit = limit
        self.max_bytes = max_bytes


class SSEParser:
    """Feed bytes, get back the `data` of each completed event, in order.

    `event:` types are parsed and dropped (every event's data is returned);
    `id:` sets `last_event_id` (ignored when it contains NUL); `retry:` sets
    `retry_ms` when it is all digits; lines starting with `:` are comments.

    When the stream breaks a size limit, `feed` returns the events completed
    before the breach and sets `error` (the pending bytes are dropped); callers
    check `error` after each `feed`. A later `feed` or `flush` raises it.
    """

    __slots__ = (
        "_data",
        "_data_size",
        "_parts",
        "_parts_size",
        "_skip_lf",
        "_started",
        "error",
        "event_type",
        "last_event_id",
        "max_event_bytes",
        "max_line_bytes",
        "retry_ms",
    )

    def __init__(
        self,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        self.max_line_bytes = max_line_bytes
        self.max_event_bytes = max_event_bytes
        self._parts: list[bytes] = []  # the unterminated tail of the stream
        self._parts_size = 0  # its length in bytes
        self._data: list[bytes] = []  # data lines of the event being built
        self._data_size = 0  # their joined length in bytes
        self._skip_lf = False  # the last chunk ended with CR: drop a leading LF
        self._started = False  # the BOM check was done
        self.error: SSELimitExceeded | None = None
        self.event_type = ""
        self.last_event_id = ""
        self.retry_ms: int | None = None

    def feed(self, chunk: bytes) -> list[str]:
        """Add bytes; return the data of every event completed by them."""
        if self.error is not None:
            raise self.error
        if not chunk:
            return []
        if (
            chunk[-2:] == b"\n\n"
            and self._started
            and not self._parts
            and not self._data
            and not self._skip_lf
            and len(chunk) <= self.max_line_bytes
            and len(chunk) <= self.max_event_bytes
            and b"\r" not in chunk
        ):
            out = self._whole_events(chunk)
            if out is not None:
                return out
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == 10:
                chunk = chunk[1:]
        if b"\r" in chunk:
            if chunk[-1] == 13:
                self._skip_lf = True
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if b"\n" not in chunk:
            if chunk:
                self._parts_size += len(chunk)
                if self._parts_size > self.max_line_bytes:
                    self._fail("line", self.max_line_bytes)
                else:
                    self._parts.append(chunk)
            return []
        if self._parts:
            self._parts.append(chunk)
            chunk = b"".join(self._parts)
            self._parts = []
            self._parts_size = 0
        if not self._started:
            self._started = True
            if chunk.startswith(_BOM):
                chunk = chunk[3:]
        lines = chunk.split(b"\n")
        tail = lines.pop()
        limit = self.max_line_bytes
        if len(chunk) > limit:  # (only then can a line be too long)
            for i, line in enumerate(lines):
                if len(line) > limit:
                    out = self._lines(lines[:i])
                    self._fail("line", limit)
                    return out
            if len(tail) > limit:
                out = self._lines(lines)
                self._fail("line", limit)
                return out
        if tail:
            self._parts.append(tail)
            self._parts_size = len(tail)
        return self._lines(lines)

    def _whole_events(self, chunk: bytes) -> list[str] | None:
        """The fast path: `chunk` is whole events of one `data: ` line each, else None.

        This is what providers send chunk after chunk. The caller checked that
        nothing is pending and that `chunk` is within both limits (so no line or
        event in it can break one), has no CR and ends with a blank line.
        """
        blocks = chunk.split(b"\n\n")
        blocks.pop()  # the empty remainder after the last blank line
        out: list[str] = []
        for block in blocks:
            if block[:6] != b"data: " or b"\n" in block:
                return None  # other fields, several lines, or an empty line: the full parser
            out.append(block[6:].decode("utf-8", "replace"))
        self.event_type = ""
        return out

    def flush(self) -> list[str]:
        """End of stream: take the unterminated last line and dispatch what is pending."""
        if self.error is not None:
            raise self.error
        lines: list[bytes] = []
        if self._parts:
            tail = b"".join(self._parts)
            self._parts = []
            self._parts_size = 0
            if not self._started and tail.startswith(_BOM):
                tail = tail[3:]
            lines.append(tail)
        lines.append(b"")
        self._skip_lf = False
        return self._lines(lines)

    def _fail(self, limit: str, max_bytes: int) -> None:
        """Record the first breach and drop what is pending."""
        if self.error is None:
            self.error = SSELimitExceeded(limit, max_bytes)
        self._parts = []
        self._parts_size = 0
        self._data = []
        self._data_size = 0

    def _lines(self, lines: list[bytes]) -> list[str]:
        """The events completed by `lines`; stops at the first line that breaks the event limit."""
        out: list[str] = []
        data = self._data
        for line in lines:
            if not line:  # blank line: dispatch
                if data:
                    if len(data) == 1:
                        out.append(data[0].decode("utf-8", "replace"))
                    else:
                        out.append(b"\n".join(data).decode("utf-8", "replace"))
                    data = self._data = []
                    self._data_size = 0
                self.event_type = ""
                continue
            if line.startswith(b"data:"):
                value = line[5:]
                if value[:1] == b" ":
                    value = value[1:]
            elif line[0] == 58:  # ":" comment / keep-alive
                continue
            else:
                name, _, value = line.partition(b":")
                if value[:1] == b" ":
                    value = value[1:]
                if name == b"event":
                    self.event_type = value.decode("utf-8", "replace")
                elif name == b"id":
                    if b"\0" not in value:
                        self.last_event_id = value.decode("utf-8", "replace")
                elif name == b"retry" and value.isdigit():
                    self.retry_ms = int(value)
                if name != b"data":  # (a line "data" without a colon is an empty value)
                    continue
            self._data_size += len(value) + 1 if data else len(value)
            if self._data_size > self.max_event_bytes:
                self._fail("event", self.max_event_bytes)
                return out
            data.append(value)
        return out


async def iter_sse(
    chunks: AsyncIterable[bytes],
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
) -> AsyncIterator[str]:
    """Convenience wrapper: the data of each event from an async stream of bytes.

    Raises `SSELimitExceeded` after the events completed before a breach.
    """
    parser = SSEParser(max_line_bytes, max_event_bytes)
    async for chunk in chunks:
        for data in parser.feed(chunk):
            yield data
        if parser.error is not None:
            raise parser.error
    for data in parser.flush():
        yield data
