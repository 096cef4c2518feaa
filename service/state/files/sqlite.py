"""Opening one of the service's SQLite files, which processes of one host may share.

`connect` sets what every such file uses — a busy time-out, the WAL journal (a killed
process loses nothing committed), `synchronous=NORMAL` — in a way several processes may
do at once: two workers opening a new file both try to switch it to WAL, and the second
switch can fail at once with "database is locked" (SQLite does not wait for the lock a
journal mode change needs); it is tried again until the file is in WAL mode.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

#: How long `connect` tries to switch a file another process is switching too.
SWITCH_TIMEOUT_S = 5.0


def connect(path: Path) -> sqlite3.Connection:
    """A connection to `path` in autocommit mode, WAL, `synchronous=NORMAL`."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        db.execute("PRAGMA busy_timeout = 5000")
        deadline = time.monotonic() + SWITCH_TIMEOUT_S
        while True:
            try:
                db.execute("PRAGMA journal_mode = WAL")
                break
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        db.execute("PRAGMA synchronous = NORMAL")
    except BaseException:
        db.close()
        raise
    return db
