"""`python -m service`: read settings once, serve until SIGTERM/SIGINT, stop gracefully.

The process runs on the event loop `AGW_EVENT_LOOP` names (uvloop's by default,
where available; see `service.process.eventloop`), its garbage collector tuned once
the service is up (`service.process.gctune`). With `AGW_WORKERS` > 1 it is instead
the supervisor of that many such processes on the same ports
(`service.process.workers`).

    python -m service [--port-file FILE]

`--port-file` gets the bound gRPC port once the service listens (with workers:
once every worker does). Settings it cannot start with — unreadable, an address in use,
a network address without authentication — are one line naming the setting to change,
and exit code 2. `--ready-fd N` is how a supervisor's worker says it
listens: one JSON line on descriptor N (its pid, replica, gRPC and HTTP ports).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

from service.assembly import logs
from service.assembly.app import App
from service.assembly.config import CannotStart, Settings, load_settings
from service.assembly.telemetry import configure as configure_telemetry
from service.process import eventloop, gctune, workers
from service.process.supervisor import announce_ready

log = logging.getLogger("agw")


#: The exit code of a service that cannot start as set.
CANNOT_START = 2


async def serve(
    settings: Settings, port_file: str | None = None, ready_fd: int | None = None
) -> int:
    """Serve until SIGTERM/SIGINT; write the bound gRPC port to `port_file` once listening,
    and announce it on the descriptor `ready_fd` (a supervisor's pipe). The exit code."""
    telemetry = configure_telemetry(settings)
    stop = asyncio.Event()  # a signal during start-up stops the service once it is up
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        app = App(settings)
    except CannotStart as problem:
        log.error("cannot start: %s", problem)
        telemetry.shutdown()
        return CANNOT_START
    log.info("event loop: %s", type(loop).__module__.split(".")[0])
    try:
        await app.start()
    except CannotStart as problem:
        log.error("cannot start: %s", problem)
        await app.stop()
        telemetry.shutdown()
        return CANNOT_START
    gctune.tune()
    if port_file:
        await asyncio.to_thread(Path(port_file).write_text, str(app.grpc.port))
    if ready_fd is not None:
        http_port = app.http.port if app.http is not None else 0
        ready = {"pid": os.getpid(), "replica": settings.replica_id, "grpc": app.grpc.port}
        announce_ready(ready_fd, json.dumps({**ready, "http": http_port}))
    await stop.wait()
    log.info("stopping: draining runs for up to %.1fs", settings.shutdown_grace_s)
    await app.stop()
    telemetry.shutdown()
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m service", description=__doc__)
    parser.add_argument("--port-file", help="write the bound gRPC port here once listening")
    parser.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        settings = load_settings()
    except CannotStart as problem:
        logs.configure("INFO", "text", "")
        log.error("cannot start: %s", problem)
        sys.exit(CANNOT_START)
    logs.configure(settings.log_level, settings.log_format, settings.worker_name)
    if settings.worker_count > 1:
        supervised = workers.supervise_service(settings, args.port_file)
        sys.exit(eventloop.run(supervised, settings.event_loop))
    code = eventloop.run(serve(settings, args.port_file, args.ready_fd), settings.event_loop)
    sys.exit(code)


if __name__ == "__main__":
    main()
