"""Logging set-up: readable text or one JSON object per line."""

from __future__ import annotations

import json
import logging
import time

from service.telemetry import TraceIdFilter

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the record's `extra` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """A readable line; a run's trace id at its end when it has one (no trailing blank)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        trace_id = getattr(record, "trace_id", "")
        return f"{line} {trace_id}" if trace_id else line


def configure(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    handler.addFilter(TraceIdFilter())  # runs' log lines carry their trace id
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # the MCP SDK's HTTP client
    logging.getLogger("httpcore2").setLevel(logging.WARNING)
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
