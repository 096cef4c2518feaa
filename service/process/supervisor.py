"""A supervisor of N worker processes serving the same ports (docs/scale-out.md, "Workers").

It starts each worker (`WorkerSpec`: its command and environment, by slot and
generation), waits until every one says it is listening, keeps them running —
a worker that exits while the supervisor is not stopping is started again after
a back-off that grows with each quick failure — and on SIGTERM/SIGINT asks every
worker to stop (SIGTERM: each drains its runs within its grace period), kills
those still running `stop_timeout_s` later, and returns.

A worker says it is listening by writing one line to the pipe whose descriptor
the supervisor adds to its command (`--ready-fd N`) and closing it; a worker that
exits or closes the pipe without that line failed to start. Failing at the first
start-up, or `MAX_START_FAILURES` times in a row later, stops everything: the
supervisor's exit code is then 1. Each worker dies with the supervisor
(`PR_SET_PDEATHSIG`: SIGTERM, so it still drains), never left behind.

Each worker gets its name in `AGW_WORKER_NAME` (`worker_name`: `w0`, `w1`, `w0.1`
once slot 0 was restarted), which tags every line it logs (`service.assembly.logs`).

Ports are shared with SO_REUSEPORT, so the kernel spreads new connections over the
listening workers; `reserve_port` gives a free one for an address of port 0 and
holds it (bound, never listening, so it takes no connection) for the supervisor's life.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("agw.supervisor")

START_TIMEOUT_S = 120.0  # a worker not listening by then failed to start
STABLE_S = 10.0  # a worker that ran this long resets the back-off
BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 30.0
MAX_START_FAILURES = 5  # quick failures in a row of one slot before giving up
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class WorkerSpec:
    """How to start one worker: its command, its environment and a name for the logs."""

    argv: list[str]
    env: dict[str, str]
    label: str = ""


@dataclass
class _Slot:
    index: int
    generation: int = 0
    failures: int = 0  # quick failures in a row
    process: asyncio.subprocess.Process | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class StartFailed(RuntimeError):
    """A worker exited, or closed its ready pipe, before it was listening."""


def reserve_port(address: str) -> tuple[str, socket.socket | None]:
    """`address` ("host:port") with a free port in place of 0, and the socket holding it.

    The socket is bound with SO_REUSEPORT and never listens: the workers bind the
    same port next to it, and while it is held no other program can take the port
    (unless, as the same user, it sets SO_REUSEPORT too).
    """
    host, _, port = address.rpartition(":")
    if int(port) != 0:
        return address, None
    bare = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    holder = socket.socket(family, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind((bare, 0))
    return f"{host}:{holder.getsockname()[1]}", holder


def worker_name(index: int, generation: int) -> str:
    """The name tagging the log lines of slot `index`'s worker of `generation` (0: the first)."""
    return f"w{index}" if generation == 0 else f"w{index}.{generation}"


def _die_with_parent() -> None:  # pragma: no cover - runs in the child, before exec
    """In the forked child: receive SIGTERM when the supervisor dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Supervisor:
    """Runs `count` workers built by `spec(index, generation)` until told to stop."""

    def __init__(
        self,
        count: int,
        spec: Callable[[int, int], WorkerSpec],
        *,
        stop_timeout_s: float,
        kind: str = "worker",
    ) -> None:
        self.count = count
        self.spec = spec
        self.stop_timeout_s = stop_timeout_s
        self.kind = kind
        self.slots = [_Slot(i) for i in range(count)]
        self._stopping = asyncio.Event()
        self._failed = False

    @property
    def pids(self) -> list[int]:
        """The running workers' process ids, by slot."""
        return [s.process.pid for s in self.slots if s.process and s.process.returncode is None]

    def stop(self) -> None:
        """Ask every worker to stop (what SIGTERM and SIGINT do)."""
        self._stopping.set()

    async def run(self, on_ready: Callable[[], object] | None = None) -> int:
        """Supervise until stopped; 0 if every worker stopped cleanly, else 1.

        `on_ready()` is called once every worker listens for the first time.
        """
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        keepers = [asyncio.create_task(self._keep(slot)) for slot in self.slots]
        ready = asyncio.create_task(self._all_ready())
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait([ready, stopping], return_when=asyncio.FIRST_COMPLETED)
            if ready.done() and not self._stopping.is_set():
                log.info("%d %ss listening", self.count, self.kind)
                if on_ready is not None:
                    on_ready()
            clean = all(await asyncio.gather(*keepers))
        finally:
            ready.cancel()
            stopping.cancel()
            for keeper in keepers:
                keeper.cancel()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        return 0 if clean and not self._failed else 1

    async def _all_ready(self) -> None:
        for slot in self.slots:
            await slot.ready.wait()

    async def _keep(self, slot: _Slot) -> bool:
        """Start the slot's worker, and again each time it exits; once stopping, stop it.
        True when it ends with its worker stopped cleanly (or none running)."""
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                process = await self._start(slot)
            except StartFailed as error:
                if self._stopping.is_set():
                    return False
                if self._give_up(slot, f"did not start: {error}", first=not slot.ready.is_set()):
                    return False
                await self._back_off(slot)
                continue
            exited = asyncio.ensure_future(process.wait())
            stopping = asyncio.ensure_future(self._stopping.wait())
            await asyncio.wait([exited, stopping], return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not exited.done():
                exited.cancel()
                return await self._stop_worker(slot, process)
            code = exited.result()
            ran_s = time.monotonic() - started
            log.warning(
                "%s %d (pid %d) exited with code %d after %.1f s",
                self.kind,
                slot.index,
                process.pid,
                code,
                ran_s,
            )
            if ran_s >= STABLE_S:
                slot.failures = 0
            elif self._give_up(slot, f"exited after {ran_s:.1f} s", first=False):
                return False
            await self._back_off(slot)
        return True

    def _give_up(self, slot: _Slot, what: str, *, first: bool) -> bool:
        """Count a quick failure of `slot`; stop everything if it is one too many."""
        slot.failures += 1
        if first or slot.failures >= MAX_START_FAILURES:
            tries = "at start-up" if first else f"{slot.failures} times in a row"
            log.error("%s %d %s (failed %s): stopping", self.kind, slot.index, what, tries)
            self._failed = True
            self._stopping.set()
            return True
        return False

    async def _back_off(self, slot: _Slot) -> None:
        delay = min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2 ** max(0, slot.failures - 1))
        log.info("%s %d: restarting in %.1f s", self.kind, slot.index, delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), delay)

    async def _start(self, slot: _Slot) -> asyncio.subprocess.Process:
        """Start the slot's next generation and wait until it listens (or stopping)."""
        spec = self.spec(slot.index, slot.generation)
        env = {**spec.env, "AGW_WORKER_NAME": worker_name(slot.index, slot.generation)}
        slot.generation += 1
        read_fd, write_fd = os.pipe()
        try:
            process = await asyncio.create_subprocess_exec(
                *spec.argv,
                "--ready-fd",
                str(write_fd),
                env=env,
                pass_fds=(write_fd,),
                preexec_fn=_die_with_parent,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        slot.process = process
        label = f", {spec.label}" if spec.label else ""
        log.info("%s %d started (pid %d%s)", self.kind, slot.index, process.pid, label)
        reading = asyncio.ensure_future(_read_line(read_fd))
        stopping = asyncio.ensure_future(self._stopping.wait())
        done, _ = await asyncio.wait(
            [reading, stopping], timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
        )
        stopping.cancel()
        if reading not in done:
            reading.cancel()
            if self._stopping.is_set():
                return process  # the caller stops it
            process.kill()
            await process.wait()
            raise StartFailed(f"not listening after {START_TIMEOUT_S:.0f} s")
        if not reading.result():
            code = await process.wait()
            raise StartFailed(f"exited with code {code}")
        log.info("%s %d (pid %d) listening", self.kind, slot.index, process.pid)
        slot.ready.set()
        return process

    async def _stop_worker(self, slot: _Slot, process: asyncio.subprocess.Process) -> bool:
        """SIGTERM the worker (it drains); kill it after `stop_timeout_s`. True on exit code 0."""
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.wait_for(process.wait(), self.stop_timeout_s)
        except TimeoutError:
            process.kill()
            code = await process.wait()
            log.error(
                "%s %d (pid %d) still running after %.1f s: killed",
                self.kind,
                slot.index,
                process.pid,
                self.stop_timeout_s,
            )
        log.info("%s %d (pid %d) exited with code %d", self.kind, slot.index, process.pid, code)
        return code == 0


async def _read_line(fd: int) -> bytes:
    """The first line written to the pipe `fd` (b"" if closed without one); closes `fd`."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    try:
        return await reader.readline()
    finally:
        transport.close()


def announce_ready(fd: int, message: str) -> None:
    """In a worker: tell the supervisor it is listening (one line on `fd`), close `fd`."""
    with os.fdopen(fd, "w") as pipe:
        pipe.write(message.rstrip("\n") + "\n")
