"""Implementations of the core's state ports (`service.core.ports`), by name.

| port | name | what |
|---|---|---|
| ChatStore | `jsonl` | one JSONL file per chat (`service/state/jsonl_chats.py`), the default |
| ChatStore | `memory` | in-process (`service/state/memory.py`) |
| ChatStore | `postgres` | PostgreSQL, shared by replicas (`service/state/postgres.py`) |
| RunLog | `files` | one file per ended run (`service/state/run_files.py`), the default |
| RunLog | `memory` | in-process |
| RunLog | `postgres` | PostgreSQL |
| RunBus | `local` | in-process (`service/state/local_bus.py`), the default |

Adding a backend is a new module here and one line in the tables below; the
settings pick one by name (`AGW_CHAT_STORE`, `AGW_RUN_LOG`, `AGW_RUN_BUS`).
Factories take plain values (`StateOptions`), never the settings object.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from service.core.ports import ChatStore, RunBus, RunLog
from service.core.waits import Waits
from service.state.jsonl_chats import FsyncPolicy, JsonlChatStore
from service.state.local_bus import LocalRunBus
from service.state.memory import MemoryChatStore, MemoryRunLog
from service.state.postgres import PostgresChatStore, PostgresRunLog
from service.state.run_files import FileRunLog


@dataclass(frozen=True, slots=True)
class StateOptions:
    """What the state backends are built from."""

    chats_dir: Path
    runs_dir: Path
    chat_fsync: FsyncPolicy = "run"
    run_log_ttl_s: float = 86400.0
    wait_timeout_s: float = 300.0
    submit_payload_limit_bytes: int = 256 * 1024
    postgres_dsn: str = ""  # e.g. postgresql://agw:secret@db.internal:5432/agw


CHAT_STORES: dict[str, Callable[[StateOptions], ChatStore]] = {
    "jsonl": lambda o: JsonlChatStore(o.chats_dir, fsync=o.chat_fsync),
    "memory": lambda o: MemoryChatStore(),
    "postgres": lambda o: PostgresChatStore(o.postgres_dsn),
}

RUN_LOGS: dict[str, Callable[[StateOptions], RunLog]] = {
    "files": lambda o: FileRunLog(o.runs_dir, o.run_log_ttl_s),
    "memory": lambda o: MemoryRunLog(o.run_log_ttl_s),
    "postgres": lambda o: PostgresRunLog(o.postgres_dsn, o.run_log_ttl_s),
}

RUN_BUSES: dict[str, Callable[[StateOptions], RunBus]] = {
    "local": lambda o: LocalRunBus(
        Waits(timeout_s=o.wait_timeout_s, payload_limit_bytes=o.submit_payload_limit_bytes)
    ),
}
