"""The service's SQLite files open in WAL mode even when processes open a new one at once
(workers of one host sharing a data directory): the switch raced to is tried again."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from service.state.files.sqlite import connect


def open_at_once(path: Path, count: int) -> tuple[list[Exception], list[str]]:
    """Open `path` from `count` threads let go together: the errors, the journal modes."""
    barrier = threading.Barrier(count)
    modes: list[str] = []
    errors: list[Exception] = []

    def open_it() -> None:
        barrier.wait()
        try:
            db = connect(path)
        except sqlite3.Error as error:
            errors.append(error)
            return
        modes.append(db.execute("PRAGMA journal_mode").fetchone()[0])
        db.close()

    threads = [threading.Thread(target=open_it) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors, modes


def test_connections_opening_a_new_file_at_once_all_get_it_in_wal_mode(tmp_path: Path) -> None:
    for trial in range(30):  # the race is lost in about one trial in ten without the retry
        assert open_at_once(tmp_path / f"{trial}.sqlite3", 6) == ([], ["wal"] * 6)
