"""An incremental Server-Sent-Events parser (WHATWG "event stream" rules).

Bytes may arrive split anywhere, even inside a CRLF pair or a UTF-8 sequence.
Lines end with LF, CRLF or a lone CR; a blank line dispatches the event. The
parser works line by line with `bytes.split`, never byte by byte, because it
sits on the per-delta hot path.

Deviation from the standard, on purpose: at end of stream, `flush()` treats an
unterminated last line as complete and dispatches a pending event instead of
discarding it (some servers omit the final blank line).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

_BOM = b"\xef\xbb\xbf"

__all__ = ["SSEParser", "iter_sse"]


class SSEParser:
    """Feed bytes, get back the `data` of each completed event, in order.

    `event:` types are parsed and dropped (every event's data is returned);
    `id:` sets `last_event_id` (ignored when it contains NUL); `retry:` sets
    `retry_ms` when it is all digits; lines starting with `:` are comments.
    """

    __slots__ = (
        "_data",
        "_parts",
        "_skip_lf",
        "_started",
        "event_type",
        "last_event_id",
        "retry_ms",
    )

    def __init__(self) -> None:
        self._parts: list[bytes] = []  # the unterminated tail of the stream
        self._data: list[bytes] = []  # data lines of the event being built
        self._skip_lf = False  # the last chunk ended with CR: drop a leading LF
        self._started = False  # the BOM check was done
        self.event_type = ""
        self.last_event_id = ""
        self.retry_ms: int | None = None

    def feed(self, chunk: bytes) -> list[str]:
        """Add bytes; return the data of every event completed by them."""
        if not chunk:
            return []
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
                self._parts.append(chunk)
            return []
        if self._parts:
            self._parts.append(chunk)
            chunk = b"".join(self._parts)
            self._parts = []
        if not self._started:
            self._started = True
            if chunk.startswith(_BOM):
                chunk = chunk[3:]
        lines = chunk.split(b"\n")
        tail = lines.pop()
        if tail:
            self._parts.append(tail)
        return self._lines(lines)

    def flush(self) -> list[str]:
        """End of stream: take the unterminated last line and dispatch what is pending."""
        lines: list[bytes] = []
        if self._parts:
            tail = b"".join(self._parts)
            self._parts = []
            if not self._started and tail.startswith(_BOM):
                tail = tail[3:]
            lines.append(tail)
        lines.append(b"")
        self._skip_lf = False
        return self._lines(lines)

    def _lines(self, lines: list[bytes]) -> list[str]:
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
                self.event_type = ""
                continue
            if line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value[:1] == b" " else value)
                continue
            if line[0] == 58:  # ":" comment / keep-alive
                continue
            name, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if name == b"data":  # "data" without a colon
                data.append(value)
            elif name == b"event":
                self.event_type = value.decode("utf-8", "replace")
            elif name == b"id":
                if b"\0" not in value:
                    self.last_event_id = value.decode("utf-8", "replace")
            elif name == b"retry" and value.isdigit():
                self.retry_ms = int(value)
        return out


async def iter_sse(chunks: AsyncIterable[bytes]) -> AsyncIterator[str]:
    """Convenience wrapper: the data of each event from an async stream of bytes."""
    parser = SSEParser()
    async for chunk in chunks:
        for data in parser.feed(chunk):
            yield data
    for data in parser.flush():
        yield data
