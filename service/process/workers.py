"""`AGW_WORKERS=N`: the service (or the HTTP adapter) as N processes on the same ports.

`python -m service` with `workers` > 1 runs `supervise_service`: a `Supervisor`
of N workers, each a whole service (`python -m service` with `AGW_WORKERS=1`:
gRPC and the HTTP adapter), binding the same gRPC and HTTP ports with
SO_REUSEPORT (`AGW_REUSE_PORT`), so that the kernel spreads connections over
them. An address of port 0 gets a free port first (`reserve_port`). Worker `i`
is replica `{base}-{i}` (`AGW_REPLICA_ID`; `base` is the supervisor's own
`replica_id`, or host-pid), `{base}-{i}.{g}` once restarted `g` times: a new
process is a new replica for the run bus, never mistaken for the one that died.

Workers share nothing in memory, so they must share their state: the Redis run
bus (any worker serves Attach/Submit/Cancel of any run) and the PostgreSQL chat
store and run log. `shared_state_problem` refuses anything else. Uploads are
files under one directory that every worker of the host reads.

`python -m service.gateway --workers N` runs `supervise_gateway`: N adapters on
one HTTP port, each calling the same gRPC target; they keep no state.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from service.assembly.config import Settings
from service.process.supervisor import Supervisor, WorkerSpec, reserve_port

log = logging.getLogger("agw.supervisor")

#: What N workers must share, and the setting's value that shares it.
SHARED_STATE = {"AGW_RUN_BUS": "redis", "AGW_CHAT_STORE": "postgres", "AGW_RUN_LOG": "postgres"}
#: Time a stopping supervisor gives its workers beyond their own grace period.
STOP_MARGIN_S = 15.0


def shared_state_problem(settings: Settings, count: int) -> str | None:
    """Why `count` workers cannot run on these settings (None: they can)."""
    current = {
        "AGW_RUN_BUS": settings.run_bus,
        "AGW_CHAT_STORE": settings.chat_store,
        "AGW_RUN_LOG": settings.run_log,
    }
    wrong = [
        f"{name}={SHARED_STATE[name]} (is {value})"
        for name, value in current.items()
        if value != SHARED_STATE[name]
    ]
    if settings.run_journal == "files":  # one process's: each would resume the others'
        wrong.append(f"AGW_RUN_JOURNAL=postgres (is {settings.run_journal_name})")
    if not wrong:
        return None
    return (
        f"AGW_WORKERS={count} runs {count} processes that must share their state; set "
        + ", ".join(wrong)
        + " with AGW_REDIS_URL and AGW_POSTGRES_DSN (docs/scale-out.md, Workers), or AGW_WORKERS=1"
    )


def replica_base(settings: Settings) -> str:
    """The supervisor's replica id, from which its workers' are made."""
    return settings.replica_id or f"{socket.gethostname()}-{os.getpid()}"


def worker_replica_id(base: str, index: int, generation: int) -> str:
    """Worker `index`'s replica id; a restarted worker (`generation` > 0) gets a new one."""
    return f"{base}-{index}" if generation == 0 else f"{base}-{index}.{generation}"


def service_workers(
    settings: Settings, grpc_address: str, http_address: str
) -> Callable[[int, int], WorkerSpec]:
    """How to start each worker of the service on the (reserved) addresses."""
    base = replica_base(settings)

    def spec(index: int, generation: int) -> WorkerSpec:
        replica = worker_replica_id(base, index, generation)
        env = {
            **os.environ,
            "AGW_WORKERS": "1",
            "AGW_REUSE_PORT": "true",
            "AGW_REPLICA_ID": replica,
            "AGW_GRPC_ADDRESS": grpc_address,
            "AGW_HTTP_ADDRESS": http_address,
        }
        return WorkerSpec([sys.executable, "-m", "service"], env, f"replica {replica}")

    return spec


async def supervise_service(settings: Settings, port_file: str | None = None) -> int:
    """Run `settings.worker_count` workers of the service until SIGTERM/SIGINT; the exit code.

    `port_file` gets the gRPC port once every worker listens.
    """
    count = settings.worker_count
    problem = shared_state_problem(settings, count)
    if problem:
        log.error("%s", problem)
        return 2
    grpc_address, grpc_holder = reserve_port(settings.grpc_address)
    http_address, http_holder = settings.http_address, None
    if settings.http_enabled:
        http_address, http_holder = reserve_port(settings.http_address)
    try:
        log.info(
            "supervising %d workers: gRPC on %s%s",
            count,
            grpc_address,
            f", HTTP on {http_address}" if settings.http_enabled else "",
        )
        supervisor = Supervisor(
            count,
            service_workers(settings, grpc_address, http_address),
            stop_timeout_s=settings.shutdown_grace_s + STOP_MARGIN_S,
        )

        def ready() -> None:
            if port_file:
                Path(port_file).write_text(grpc_address.rpartition(":")[2])

        return await supervisor.run(ready)
    finally:
        for holder in (grpc_holder, http_holder):
            if holder is not None:
                holder.close()


async def supervise_gateway(
    count: int, grpc_target: str, address: str, allowed_hosts: list[str]
) -> int:
    """Run `count` HTTP adapters on `address` in front of `grpc_target`; the exit code."""
    address, holder = reserve_port(address)
    hosts = [arg for host in allowed_hosts for arg in ("--allowed-host", host)]
    argv = [sys.executable, "-m", "service.gateway", "--workers", "1", "--grpc-target", grpc_target]
    argv += ["--address", address, *hosts]
    env = {**os.environ, "AGW_REUSE_PORT": "true"}
    try:
        log.info("supervising %d HTTP adapters on %s", count, address)
        supervisor = Supervisor(
            count, lambda index, generation: WorkerSpec(argv, env), stop_timeout_s=STOP_MARGIN_S
        )
        return await supervisor.run()
    finally:
        if holder is not None:
            holder.close()
