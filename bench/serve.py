"""`python -m bench.serve KIND`: one benchmarked process (provider, baseline, relay or gateway).

Prints `READY {"port": ..., "control": ..., "pid": ...}` once listening, serves
until its stdin closes (or SIGTERM), then stops cleanly. With `--profile FILE`
the process runs under cProfile and writes the stats to FILE when it stops.
Every process runs on the event loop `AGW_EVENT_LOOP` names, as the service
does (`service.process.eventloop`: uvloop's by default, where available), so
that the baselines and the gateway are compared on the same loop; every server's
garbage collector is tuned as the service's is (`service.process.gctune`).
The relays (`relay`, `relay-aiohttp`, `relay-contract`) are described in bench/relay.py.
The gateway's variants with the OpenTelemetry SDK and without instrumentation
(`gateway+otel`, `gateway-no-otel`, `gateway-no-otel-2`) are described in
bench/otel.py.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from bench.baseline import bare_query, start_grpc
from bench.control import ControlServer, announce, wait_for_stop
from bench.gateway import start_gateway
from bench.procs import ROOT
from bench.protocol import GATEWAYS, SERVERS
from bench.provider import bench_provider
from bench.relay import AiohttpRelay, ContractRelay, HttpxRelay
from service.process import eventloop, gctune

KINDS = ("provider", *SERVERS)


@contextlib.asynccontextmanager
async def _running(kind: str, args: argparse.Namespace) -> AsyncIterator[tuple[int, ControlServer]]:
    """Start `kind`; yield its port and control endpoint; stop it on exit."""
    control = ControlServer()
    stop: Callable[[], Awaitable[None]]
    if kind == "provider":
        provider = await bench_provider().start()
        control.extra = lambda: {
            "open_connections": provider.open_connections,
            "disconnects": provider.disconnects,
        }
        port, stop = provider.port, provider.stop
    elif kind in GATEWAYS:
        workdir = Path(tempfile.mkdtemp(prefix="agw-bench-", dir=_data_root()))
        gateway = await start_gateway(args.provider_url, workdir, args.max_streams, kind)
        port = gateway.port
        control.extra, control.flush = gateway.counters, gateway.flush

        async def stop() -> None:
            try:
                await gateway.stop()
            finally:
                shutil.rmtree(workdir, ignore_errors=True)

    elif kind == "bare":
        server, port = await start_grpc(bare_query)
        stop = lambda: server.stop(1.0)  # noqa: E731
    else:
        if kind == "relay":
            relay: HttpxRelay | AiohttpRelay = HttpxRelay(args.provider_url, args.max_streams)
        else:
            cls = ContractRelay if kind == "relay-contract" else AiohttpRelay
            relay = cls(args.provider_url, args.max_streams)
            await relay.start()
        server, port = await start_grpc(relay.Query)

        async def stop() -> None:
            await server.stop(1.0)
            await relay.aclose()

    await control.start()
    try:
        yield port, control
    finally:
        await control.stop()
        await stop()


def _data_root() -> Path:
    """Where a gateway under test keeps its files: `var/bench/` in the repository, next to
    the data directory `make run` uses (`var/`), rather than /tmp — on machines where /tmp
    is watched (this one: creating a file there costs about ten times more than elsewhere
    on the same disk), /tmp would measure the watcher. `AGW_BENCH_DATA_ROOT` overrides it.
    """
    root = Path(os.environ.get("AGW_BENCH_DATA_ROOT") or ROOT / "var" / "bench")
    root.mkdir(parents=True, exist_ok=True)
    return root


async def serve(kind: str, args: argparse.Namespace) -> None:
    async with _running(kind, args) as (port, control):
        if kind != "provider":  # each server as the service runs (`python -m service`)
            gctune.tune()
        announce(kind=kind, port=port, control=control.port, pid=os.getpid())
        await wait_for_stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.serve", description=__doc__)
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--provider-url", default="", help="base URL of the provider, up to /v1")
    parser.add_argument("--max-streams", type=int, default=2000, help="connection and run limits")
    parser.add_argument("--profile", default="", help="write cProfile stats here on exit")
    args = parser.parse_args(argv)
    if args.kind not in ("provider", "bare") and not args.provider_url:
        parser.error(f"{args.kind} needs --provider-url")
    logging.basicConfig(level=logging.WARNING)
    profile = cProfile.Profile() if args.profile else None
    if profile is not None:
        profile.enable()
    try:
        eventloop.run(serve(args.kind, args), os.environ.get("AGW_EVENT_LOOP", "auto"))
    finally:
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.profile)


if __name__ == "__main__":
    main()
