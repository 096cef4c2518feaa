"""Guards on tool calls: doom-loop detection and output truncation.

- A model repeating the same call (same tool, same arguments) three times within
  its last ten calls is in a loop: the third call is not executed, a
  `loop.detect` event is emitted, and the model is told to change course.
- A tool's output fed back to the model is bounded: lines longer than 2,000
  characters are cut, and the whole text to 50 KB, each cut marked, so that one
  noisy tool cannot flood the context window.
"""

from __future__ import annotations

import json
from typing import Any

LOOP_WINDOW = 10
LOOP_REPEATS = 3
MAX_LINE_CHARS = 2000
MAX_OUTPUT_BYTES = 50 * 1024


def loop_message(name: str, repeats: int) -> str:
    return (
        f"not executed: '{name}' was already called {repeats - 1} times with these exact "
        "arguments; use the results you have, change the arguments, or answer"
    )


class LoopDetector:
    """Remembers a run's recent calls and spots the repeated one.

    The window is a short list, trimmed as it grows: every run has a detector, most never
    call a tool, and an empty list costs a tenth of an empty bounded deque."""

    __slots__ = ("recent", "repeats", "window")

    def __init__(self, window: int = LOOP_WINDOW, repeats: int = LOOP_REPEATS) -> None:
        self.recent: list[tuple[str, str]] = []
        self.window = window
        self.repeats = repeats

    def check(self, key: tuple[str, str]) -> int:
        """Record the call `key` (`identity`); how many times it now occurs in the window
        if that is a loop, else 0."""
        self.recent.append(key)
        if len(self.recent) > self.window:
            del self.recent[0]
        count = sum(1 for seen in self.recent if seen == key)
        return count if count >= self.repeats else 0


def identity(name: str, arguments: str) -> tuple[str, str]:
    """What makes two calls identical: the tool and its arguments in one spelling."""
    return name, canonical(arguments)


def canonical(arguments: str) -> str:
    """The call's arguments in one spelling: parsed, keys sorted, no spaces (else as given)."""
    try:
        return json.dumps(json.loads(arguments or "{}"), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return arguments


def truncate_output(result: Any) -> Any:
    """`result` bounded for the model: long lines and a long text cut, with a note."""
    text = result if isinstance(result, str) else None
    if text is None:
        encoded = json.dumps(result, ensure_ascii=False, default=str)
        if len(encoded) <= MAX_OUTPUT_BYTES:
            return result
        text = encoded
    lines = text.split("\n")
    cut_lines = 0
    for index, line in enumerate(lines):
        if len(line) > MAX_LINE_CHARS:
            lines[index] = line[:MAX_LINE_CHARS] + f"… [line cut, {len(line)} chars]"
            cut_lines += 1
    bounded = "\n".join(lines) if cut_lines else text
    data = bounded.encode()
    if len(data) > MAX_OUTPUT_BYTES:
        kept = data[:MAX_OUTPUT_BYTES].decode(errors="ignore")
        bounded = kept + f"\n… [output cut: {len(data)} bytes, the first {MAX_OUTPUT_BYTES} kept]"
    return bounded
