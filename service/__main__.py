"""`python -m service`: read settings once, serve until SIGTERM/SIGINT, stop gracefully.

The process runs on the event loop `AGW_EVENT_LOOP` names (uvloop's by default,
where available; see `service.eventloop`), its garbage collector tuned once the
service is up (`service.gctune`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

from service import eventloop, gctune, logs
from service.app import App
from service.config import Settings
from service.telemetry import configure as configure_telemetry

log = logging.getLogger("agw")


async def serve(settings: Settings, port_file: str | None = None) -> None:
    """Serve until SIGTERM/SIGINT; write the bound gRPC port to `port_file` once listening."""
    telemetry = configure_telemetry(settings)
    log.info("event loop: %s", type(asyncio.get_running_loop()).__module__.split(".")[0])
    app = App(settings)
    await app.start()
    gctune.tune()
    if port_file:
        await asyncio.to_thread(Path(port_file).write_text, str(app.grpc.port))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping: draining runs for up to %.1fs", settings.shutdown_grace_s)
    await app.stop()
    telemetry.shutdown()


def main() -> None:
    settings = Settings()
    logs.configure(settings.log_level, settings.log_format)
    eventloop.run(serve(settings), settings.event_loop)


if __name__ == "__main__":
    main()
