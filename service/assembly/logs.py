"""Logging set-up: readable text or one JSON object per line.

A worker of a supervisor (`AGW_WORKERS` > 1, docs/scale-out.md, "Workers") tags every line
with its name (`w0`, `w1`, `w0.1` once restarted): `[w0]` before the logger in
the text format, a `worker` field in the JSON format. The supervisor's own lines
carry no tag.
"""

from __future__ import annotations

import json
import logging
import time

from service.assembly.telemetry import TraceIdFilter

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the record's `extra` fields (and `worker`)."""

    def __init__(self, worker: str = "") -> None:
        super().__init__()
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self.worker:
            entry["worker"] = self.worker
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """A readable line, `[worker]` before the logger when it has one; a run's trace id at
    its end when it has one (no trailing blank)."""

    def __init__(self, worker: str = "") -> None:
        tag = f"[{worker}] " if worker else ""
        super().__init__(f"%(asctime)s %(levelname)-7s {tag}%(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        trace_id = getattr(record, "trace_id", "")
        return f"{line} {trace_id}" if trace_id else line


def configure(level: str, fmt: str, worker: str = "") -> None:
    """Log to stderr at `level` in `fmt`; `worker` (a supervisor's worker) tags each line."""
    handler = logging.StreamHandler()
    handler.addFilter(TraceIdFilter())  # runs' log lines carry their trace id
    if fmt == "json":
        handler.setFormatter(JsonFormatter(worker))
    else:
        handler.setFormatter(TextFormatter(worker))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # the MCP SDK's HTTP client
    logging.getLogger("httpcore2").setLevel(logging.WARNING)
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
