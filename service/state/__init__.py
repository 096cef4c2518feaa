"""Implementations of the core's state ports (`service.core.ports`), by name.

One folder per backend: `files/` (the embedded default), `local/` (in-process),
`postgres/` and `redis/` (shared by replicas); what several of them use is a module
here (`summaries.py`, `framing.py`, `run_refs.py`).

| port | name | what |
|---|---|---|
| ChatStore | `jsonl` | one JSONL file per chat (`files/chats.py`), the default |
| ChatStore | `memory` | in-process (`local/stores.py`) |
| ChatStore | `postgres` | PostgreSQL, shared by replicas (`postgres/chats.py`) |
| RunLog | `files` | a SQLite file, a row per ended run (`files/run_log.py`), the default |
| RunLog | `memory` | in-process (`local/stores.py`) |
| RunLog | `postgres` | PostgreSQL (`postgres/run_log.py`) |
| RunBus | `local` | in-process (`local/bus.py`), the default |
| RunBus | `redis` | through Redis, for several replicas (`redis/bus.py`) |
| UploadStore | `files` | one directory per upload (`files/uploads.py`), the default |
| UploadStore | `memory` | in-process (`local/stores.py`) |
| UploadStore | `postgres` | PostgreSQL, bytes too, shared by replicas (`postgres/uploads.py`) |
| RunJournal | `files` | a SQLite file of the runs in flight (`files/journal.py`), the default |
| RunJournal | `memory` | in-process (`local/stores.py`): runs outlive their task, not the process |
| RunJournal | `postgres` | PostgreSQL (`postgres/journal.py`): replicas resume lost ones' runs |
| RunJournal | `none` | runs are not journaled: they end with their process |
| QuotaCounters | `local` | in-process (`local/quotas.py`) |
| QuotaCounters | `redis` | in Redis, shared by replicas (`redis/quotas.py`) |
| AgentStore | `files` | none: agents come from the agents directory alone |
| AgentStore | `memory` | in-process (`local/agents.py`) |
| AgentStore | `postgres` | PostgreSQL, shared, changes notified (`postgres/agents.py`) |
| SpendLedger | `files` | a SQLite file beside the run log (`files/ledger.py`) |
| SpendLedger | `memory` | in-process (`local/quotas.py`) |
| SpendLedger | `postgres` | PostgreSQL, shared by replicas (`postgres/ledger.py`) |
| WebhookStore | `files` | webhooks and queued notifications in SQLite (`files/webhooks.py`) |
| WebhookStore | `memory` | in-process (`local/webhooks.py`): the queue dies with the process |
| WebhookStore | `postgres` | PostgreSQL, shared by replicas (`postgres/webhooks.py`) |

Adding a backend is a new module in its backend's folder (a new folder for a new
kind of storage) and one line in the tables below; the settings pick one by name
(`AGW_CHAT_STORE`, `AGW_RUN_LOG`, `AGW_RUN_BUS`, `AGW_UPLOAD_STORE`, `AGW_RUN_JOURNAL`,
`AGW_SPEND_LEDGER`, `AGW_AGENT_STORE`, `AGW_WEBHOOK_STORE`; the quota counters follow
`AGW_RUN_BUS`).
Factories take plain values (`StateOptions`), never the settings object.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from service.core.agents.store import AgentStore
from service.core.ports import (
    ChatStore,
    QuotaCounters,
    RunBus,
    RunJournal,
    RunLog,
    SpendLedger,
    UploadStore,
)
from service.core.run.waits import Waits
from service.core.webhooks import WebhookStore
from service.state.files.chats import FsyncPolicy, JsonlChatStore
from service.state.files.journal import FileRunJournal
from service.state.files.ledger import FileSpendLedger
from service.state.files.run_log import FileRunLog
from service.state.files.uploads import FileUploadStore
from service.state.files.webhooks import FileWebhookStore
from service.state.files.writer import DiskWriter
from service.state.local.agents import LocalAgentStore
from service.state.local.bus import LocalRunBus
from service.state.local.quotas import LocalQuotaCounters, LocalSpendLedger
from service.state.local.stores import (
    LocalChatStore,
    LocalRunJournal,
    LocalRunLog,
    LocalUploadStore,
)
from service.state.local.webhooks import LocalWebhookStore
from service.state.postgres.agents import PostgresAgentStore
from service.state.postgres.chats import PostgresChatStore
from service.state.postgres.journal import PostgresRunJournal
from service.state.postgres.ledger import PostgresSpendLedger
from service.state.postgres.run_log import PostgresRunLog
from service.state.postgres.uploads import PostgresUploadStore
from service.state.postgres.webhooks import PostgresWebhookStore
from service.state.redis.bus import RedisRunBus
from service.state.redis.quotas import RedisQuotaCounters


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
    postgres_timeout_s: float = 10.0  # connecting, and each statement
    uploads_dir: Path | None = None  # the `files` upload store's; default: beside chats_dir
    # The Redis run bus (`redis/`): where, which replica this is ("": a unique id),
    # a silent owner's lease, an ended run's stream, its length bound, a forwarded call.
    redis_url: str = field(default="redis://127.0.0.1:6379/0", repr=False)
    replica_id: str = ""
    lease_ttl_s: float = 10.0
    stream_ttl_s: float = 600.0
    stream_maxlen: int = 100_000
    reply_timeout_s: float = 5.0
    # The thread the file backends' disk work runs in, grouped (`files/writer.py`).
    writer: DiskWriter = field(default_factory=DiskWriter, repr=False, compare=False)


CHAT_STORES: dict[str, Callable[[StateOptions], ChatStore]] = {
    "jsonl": lambda o: JsonlChatStore(o.chats_dir, fsync=o.chat_fsync, writer=o.writer),
    "memory": lambda o: LocalChatStore(),
    "postgres": lambda o: PostgresChatStore(o.postgres_dsn, timeout_s=o.postgres_timeout_s),
}

RUN_LOGS: dict[str, Callable[[StateOptions], RunLog]] = {
    "files": lambda o: FileRunLog(o.runs_dir, o.run_log_ttl_s, writer=o.writer),
    "memory": lambda o: LocalRunLog(o.run_log_ttl_s),
    "postgres": lambda o: PostgresRunLog(
        o.postgres_dsn, o.run_log_ttl_s, timeout_s=o.postgres_timeout_s
    ),
}

UPLOAD_STORES: dict[str, Callable[[StateOptions], UploadStore]] = {
    "files": lambda o: FileUploadStore(o.uploads_dir or o.chats_dir.parent / "uploads"),
    "memory": lambda o: LocalUploadStore(),
    "postgres": lambda o: PostgresUploadStore(o.postgres_dsn, timeout_s=o.postgres_timeout_s),
}

RUN_BUSES: dict[str, Callable[[StateOptions], RunBus]] = {
    "local": lambda o: LocalRunBus(
        Waits(timeout_s=o.wait_timeout_s, payload_limit_bytes=o.submit_payload_limit_bytes)
    ),
    "redis": lambda o: RedisRunBus(
        o.redis_url,
        replica_id=o.replica_id,
        waits=Waits(timeout_s=o.wait_timeout_s, payload_limit_bytes=o.submit_payload_limit_bytes),
        lease_ttl_s=o.lease_ttl_s,
        stream_ttl_s=o.stream_ttl_s,
        lost_ttl_s=o.run_log_ttl_s,
        stream_maxlen=o.stream_maxlen,
        reply_timeout_s=o.reply_timeout_s,
    ),
}

RUN_JOURNALS: dict[str, Callable[[StateOptions], RunJournal | None]] = {
    "files": lambda o: FileRunJournal(o.runs_dir),
    "memory": lambda o: LocalRunJournal(),
    "postgres": lambda o: PostgresRunJournal(o.postgres_dsn, timeout_s=o.postgres_timeout_s),
    "none": lambda o: None,
}

QUOTA_COUNTERS: dict[str, Callable[[StateOptions], QuotaCounters]] = {
    "local": lambda o: LocalQuotaCounters(),
    "redis": lambda o: RedisQuotaCounters(o.redis_url, timeout_s=o.reply_timeout_s),
}

SPEND_LEDGERS: dict[str, Callable[[StateOptions], SpendLedger]] = {
    "files": lambda o: FileSpendLedger(o.runs_dir, writer=o.writer),
    "memory": lambda o: LocalSpendLedger(),
    "postgres": lambda o: PostgresSpendLedger(o.postgres_dsn, timeout_s=o.postgres_timeout_s),
}

AGENT_STORES: dict[str, Callable[[StateOptions], AgentStore | None]] = {
    "files": lambda o: None,
    "memory": lambda o: LocalAgentStore(),
    "postgres": lambda o: PostgresAgentStore(o.postgres_dsn, timeout_s=o.postgres_timeout_s),
}

WEBHOOK_STORES: dict[str, Callable[[StateOptions], WebhookStore]] = {
    "files": lambda o: FileWebhookStore(o.runs_dir, o.run_log_ttl_s),
    "memory": lambda o: LocalWebhookStore(),
    "postgres": lambda o: PostgresWebhookStore(
        o.postgres_dsn, ttl_s=o.run_log_ttl_s, timeout_s=o.postgres_timeout_s
    ),
}
