"""A spinner on the terminal while a run has shown nothing yet."""

from __future__ import annotations

import threading
from typing import TextIO

FRAMES = "|/-\\"
CLEAR = "\r\x1b[K"  # back to the line's start, and erase it


class Spinner:
    """Turns on `stream` (a terminal) every `interval` seconds until `stop`, which erases it:
    the line is then as it was, for the output that follows."""

    def __init__(self, stream: TextIO, text: str = "waiting for agw…", interval: float = 0.1):
        self.stream, self.text, self.interval = stream, text, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._spin, name="agw-spinner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and erase the spinner (once; later calls do nothing)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.stream.write(CLEAR)
        self.stream.flush()

    def _spin(self) -> None:
        frame = 0
        while not self._stop.is_set():
            self.stream.write(f"\r{FRAMES[frame % len(FRAMES)]} {self.text}")
            self.stream.flush()
            frame += 1
            self._stop.wait(self.interval)
