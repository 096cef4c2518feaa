"""Measures for the sandbox tests: disk usage on the host, and how many commands overlapped."""

from __future__ import annotations

import os
from pathlib import Path

SLACK = 64 * 1024
"""What a directory may take on the host beyond its quota (the directories' own blocks)."""


def disk_usage(directory: Path) -> int:
    """Bytes allocated on the host for `directory` and everything under it (links not followed)."""
    total = directory.lstat().st_blocks * 512
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            total += (Path(root) / name).lstat().st_blocks * 512
    return total


def snapshot(directory: Path) -> dict[str, tuple[str, str]]:
    """Every entry under `directory`: its kind and its content (file text, link target)."""
    found: dict[str, tuple[str, str]] = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = Path(root) / name
            key = str(path.relative_to(directory))
            if path.is_symlink():
                found[key] = ("link", os.readlink(path))
            elif path.is_dir():
                found[key] = ("dir", "")
            else:
                found[key] = ("file", path.read_bytes().decode(errors="replace"))
    return found


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of (start, end) intervals that overlap at one instant."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def intervals_in(text: str) -> list[tuple[float, float]]:
    """(start, end) pairs from lines 'start T' and 'end T' written by the commands, in order."""
    starts: list[float] = []
    pairs: list[tuple[float, float]] = []
    for line in text.split("\n"):
        if line.startswith("start "):
            starts.append(float(line.split()[1]))
        elif line.startswith("end "):
            pairs.append((starts.pop(0), float(line.split()[1])))
    assert not starts, "a command started and never ended"
    return pairs


TIMED = "echo start $(date +%s.%N) >> times; sleep 0.5; echo end $(date +%s.%N) >> times"
"""A command that records when it ran in the `times` file of its working directory."""
