"""`python -m service.gateway --grpc-target HOST:PORT`: the HTTP/SSE adapter as its own process.

Serves the HTTP API, the SSE streams and the web page on `--address` (default
the `http_address` setting) in front of the gRPC service at `--grpc-target`
(default the `http_grpc_target` setting, else `grpc_address`), answering the
`Host` names given by `--allowed-host` (repeatable; default the
`http_allowed_hosts` setting; the listen address's host is always allowed).
Every other setting (heartbeat, write time-out, body limit, CORS origins) is
read as by the service itself. Stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from service import logs
from service.config import Settings
from service.gateway.server import HttpGateway


async def serve(
    settings: Settings, grpc_target: str, address: str, allowed_hosts: list[str]
) -> None:
    gateway = HttpGateway(
        grpc_target,
        heartbeat_s=settings.http_heartbeat_s,
        write_timeout_s=settings.http_write_timeout_s,
        max_body_bytes=settings.http_max_body_bytes,
        cors_origins=settings.http_cors_origins,
        allowed_hosts=allowed_hosts,
    )
    await gateway.start(address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
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
    args = parser.parse_args(argv)
    logs.configure(settings.log_level, settings.log_format)
    allowed_hosts = args.allowed_hosts or settings.http_allowed_hosts
    asyncio.run(serve(settings, args.grpc_target, args.address, allowed_hosts))


if __name__ == "__main__":
    main()
