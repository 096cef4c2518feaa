"""`python -m service.gateway --grpc-target HOST:PORT`: the HTTP/SSE adapter as its own process.

Serves the HTTP API, the SSE streams and the web page on `--address` (default
the `http_address` setting) in front of the gRPC service at `--grpc-target`
(default the `http_grpc_target` setting, else `grpc_address`), answering the
`Host` names given by `--allowed-host` (repeatable; default the
`http_allowed_hosts` setting; the listen address's host is always allowed).
Every other setting (heartbeat, write time-out, body limit, CORS origins) is
read as by the service itself. Stops on SIGTERM/SIGINT. It runs on the event
loop `AGW_EVENT_LOOP` names, as the service does (`service.process.eventloop`).

`--workers N` (default the `workers` setting, `AGW_WORKERS`; 0 or "auto": one
per CPU) runs N such processes on the same address (SO_REUSEPORT) under a
supervisor (`service.process.workers`); the adapter keeps no state of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys

from service.assembly import logs
from service.assembly.config import Settings
from service.gateway.server import HttpGateway
from service.process import eventloop, workers
from service.process.supervisor import announce_ready

log = logging.getLogger("agw.http")


async def serve(
    settings: Settings,
    grpc_target: str,
    address: str,
    allowed_hosts: list[str],
    ready_fd: int | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT; announce the bound port on `ready_fd` (a supervisor's pipe)."""
    log.info("event loop: %s", type(asyncio.get_running_loop()).__module__.split(".")[0])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    gateway = HttpGateway(
        grpc_target,
        heartbeat_s=settings.http_heartbeat_s,
        write_timeout_s=settings.http_write_timeout_s,
        max_body_bytes=settings.http_max_body_bytes,
        cors_origins=settings.http_cors_origins,
        allowed_hosts=allowed_hosts,
    )
    await gateway.start(address, reuse_port=settings.reuse_port)
    if ready_fd is not None:
        announce_ready(ready_fd, json.dumps({"pid": os.getpid(), "http": gateway.port}))
    try:
        await stop.wait()
    finally:
        await gateway.stop()


def main(argv: list[str] | None = None) -> None:
    settings = Settings()
    parser = argparse.ArgumentParser(prog="python -m service.gateway", description=__doc__)
    parser.add_argument(
        "--grpc-target",
        default=settings.http_grpc_target or settings.grpc_address,
        help="gRPC service to call, HOST:PORT (default: %(default)s)",
    )
    parser.add_argument(
        "--address",
        default=settings.http_address,
        help="HTTP listen address, HOST:PORT (default: %(default)s)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        dest="allowed_hosts",
        metavar="HOST",
        help="a Host header to answer: name, name:port, .domain or * (repeatable; "
        f"default: {' '.join(settings.http_allowed_hosts)})",
    )
    parser.add_argument(
        "--workers",
        default=str(settings.workers),
        help="processes serving the address: N, or 0 / auto for one per CPU "
        "(default: %(default)s, the AGW_WORKERS setting)",
    )
    parser.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    count = _worker_count(parser, args.workers)
    logs.configure(settings.log_level, settings.log_format, settings.worker_name)
    allowed_hosts = args.allowed_hosts or settings.http_allowed_hosts
    if count > 1:
        code = workers.supervise_gateway(count, args.grpc_target, args.address, allowed_hosts)
        sys.exit(eventloop.run(code, settings.event_loop))
    eventloop.run(
        serve(settings, args.grpc_target, args.address, allowed_hosts, args.ready_fd),
        settings.event_loop,
    )


def _worker_count(parser: argparse.ArgumentParser, value: str) -> int:
    """`--workers`: N ≥ 1, or 0 / "auto" for one per CPU."""
    if value.strip().lower() == "auto":
        return os.cpu_count() or 1
    try:
        count = int(value)
    except ValueError:
        parser.error(f"--workers: a number or 'auto', not {value!r}")
    if count < 0:
        parser.error("--workers: at least 0 (0: one per CPU)")
    return count or os.cpu_count() or 1


if __name__ == "__main__":
    main()
