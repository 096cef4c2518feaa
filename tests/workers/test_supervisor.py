"""The supervisor's refusals and failures, the worker count, and `python -m service.gateway
--workers N`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
from pathlib import Path

import httpx
import pytest

from service.assembly.config import Settings
from service.process import supervisor
from service.process.supervisor import Supervisor, WorkerSpec, reserve_port
from service.process.workers import shared_state_problem, worker_replica_id
from service.testing import free_port
from tests.workers.conftest import ROOT, START_TIMEOUT_S, Service, service_env
from tests.workers.test_workers import _established


async def _run(tmp_path: Path, argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *argv,
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), START_TIMEOUT_S)
    assert process.returncode is not None
    return process.returncode, output.decode()


@pytest.mark.parametrize(
    ("backends", "wrong"),
    [
        (
            {},
            "AGW_RUN_BUS=redis (is local), AGW_CHAT_STORE=postgres (is jsonl), "
            "AGW_RUN_LOG=postgres (is files)",
        ),
        (
            {"AGW_RUN_BUS": "redis", "AGW_CHAT_STORE": "postgres", "AGW_RUN_LOG": "memory"},
            "AGW_RUN_LOG=postgres (is memory)",
        ),
    ],
)
async def test_workers_on_unshared_state_are_refused_naming_the_settings(
    tmp_path: Path, backends: dict[str, str], wrong: str
) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "gen"))),
        "AGW_WORKERS": "2",
        "AGW_GRPC_ADDRESS": "127.0.0.1:0",
        "AGW_HTTP_ENABLED": "false",
        **{name: "" for name in ("AGW_RUN_BUS", "AGW_CHAT_STORE", "AGW_RUN_LOG")},
        **backends,
    }
    env = {name: value for name, value in env.items() if value}
    code, output = await _run(tmp_path, ["-m", "service"], env)
    assert code == 2
    assert (
        "ERROR   agw.supervisor: AGW_WORKERS=2 runs 2 processes that must share their state; "
        f"set {wrong} with AGW_REDIS_URL and AGW_POSTGRES_DSN (docs/scale-out.md, Workers), "
        "or AGW_WORKERS=1"
    ) in output
    assert "started (pid" not in output


async def test_workers_failing_at_start_up_stop_the_supervisor(
    tmp_path: Path, redis_url: str
) -> None:
    dsn = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"  # nothing listens there
    env = service_env(tmp_path, "http://127.0.0.1:1/v1", dsn, redis_url)
    code, output = await _run(tmp_path, ["-m", "service"], env)
    assert code == 1
    assert re.search(r"worker \d did not start: exited with code 1 \(failed at start-up\)", output)
    assert "workers listening" not in output


def test_the_worker_count_is_n_or_one_per_cpu() -> None:
    assert Settings().worker_count == 1
    assert Settings(workers=3).worker_count == 3
    assert Settings(workers=0).worker_count == os.cpu_count()
    assert Settings(workers="auto").worker_count == os.cpu_count()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="workers"):
        Settings(workers=-1)


def test_shared_state_is_what_many_workers_need() -> None:
    shared = Settings(run_bus="redis", chat_store="postgres", run_log="postgres")
    assert shared_state_problem(shared, 4) is None
    assert "AGW_CHAT_STORE=postgres (is memory)" in str(
        shared_state_problem(shared.model_copy(update={"chat_store": "memory"}), 4)
    )
    assert "AGW_RUN_JOURNAL=postgres (is files)" in str(  # a journal of one process
        shared_state_problem(shared.model_copy(update={"run_journal": "files"}), 4)
    )


def test_a_restarted_worker_is_a_new_replica() -> None:
    assert [worker_replica_id("h-7", 1, g) for g in range(3)] == ["h-7-1", "h-7-1.1", "h-7-1.2"]


def test_a_port_of_zero_is_reserved_and_held() -> None:
    address, holder = reserve_port("127.0.0.1:0")
    assert holder is not None
    with holder:
        port = int(address.rpartition(":")[2])
        assert port > 0 and holder.getsockname() == ("127.0.0.1", port)
    assert reserve_port("127.0.0.1:8080") == ("127.0.0.1:8080", None)


async def test_the_http_adapter_runs_as_workers_on_one_port(
    tmp_path: Path, service: Service
) -> None:
    """`python -m service.gateway --workers 2` in front of the service: both adapters take
    connections; one killed is replaced while the other serves."""
    log_file = tmp_path / "adapters.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "gen")))}
    argv = ["-m", "service.gateway", "--workers", "2", "--address", "127.0.0.1:0"]
    argv += ["--grpc-target", f"127.0.0.1:{service.grpc_port}"]
    with log_file.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, *argv, cwd=tmp_path, env=env, stdout=log, stderr=log
        )
    adapters = Service(process, service.grpc_port, 0, log_file, service.redis_url)
    headers = {"authorization": "Bearer key-of-alice"}
    clients = [httpx.AsyncClient(headers=headers) for _ in range(16)]
    try:
        await adapters.wait_log(r"2 workers listening")
        found = re.search(r"supervising 2 HTTP adapters on 127\.0\.0\.1:(\d+)", adapters.log())
        assert found is not None
        url = f"http://127.0.0.1:{found.group(1)}/api/agents"
        answers = await asyncio.gather(*(client.get(url) for client in clients))
        pids = [pid for pid, _ in _started(adapters.log()).values()]
        held = {pid: _established(pid, int(found.group(1))) for pid in pids}
        os.kill(pids[0], signal.SIGKILL)
        await adapters.wait_log(
            r"worker 0 started \(pid \d+\)(?s:.*)worker 0 \(pid \d+\) listening"
            r"(?s:.*)worker 0 \(pid \d+\) listening"
        )
        async with httpx.AsyncClient(headers=headers) as fresh:
            again = [await fresh.get(url) for _ in range(4)]
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 30)
    finally:
        for client in clients:
            with contextlib.suppress(Exception):
                await client.aclose()
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert [a.status_code for a in answers] == [200] * 16
    assert sum(held.values()) == 16 and all(held.values()), held
    assert f"worker 0 (pid {pids[0]}) exited with code -9" in adapters.log()
    assert [a.status_code for a in again] == [200] * 4
    assert code == 0
    assert adapters.log().count("agw.http: event loop: uvloop") == 3  # two, and the new one


def _started(log: str) -> dict[int, tuple[int, str]]:
    """The latest worker started in each slot: its pid (and no replica: adapters have none)."""
    return {
        int(slot): (int(pid), "")
        for slot, pid in re.findall(r"worker (\d+) started \(pid (\d+)\)", log)
    }


# The supervisor itself, on workers that are small Python scripts: each gets
# `--ready-fd N` appended to its command, as the service's workers do.
ANNOUNCE = "import os, sys; fd = int(sys.argv[-1]); os.write(fd, b'ready\\n'); os.close(fd)\n"


def _script(body: str, setup: str = "") -> WorkerSpec:
    """A worker running `setup`, then saying it listens, then running `body`."""
    return WorkerSpec([sys.executable, "-c", setup + ANNOUNCE + body], dict(os.environ))


async def test_a_worker_dying_quickly_again_and_again_stops_the_supervisor(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(supervisor, "BACKOFF_MIN_S", 0.01)
    starts: list[tuple[int, int]] = []

    def spec(index: int, generation: int) -> WorkerSpec:
        starts.append((index, generation))
        if index == 0:
            return _script("import time; time.sleep(60)")
        return _script("raise SystemExit(3)")  # listening, then gone at once

    caplog.set_level(logging.INFO, "agw.supervisor")
    code = await asyncio.wait_for(Supervisor(2, spec, stop_timeout_s=5).run(), 30)
    assert code == 1
    assert sorted(starts) == [(0, 0), *((1, g) for g in range(supervisor.MAX_START_FAILURES))]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("worker 1 (pid" in m and "exited with code 3" in m for m in messages) == 5
    assert "worker 1 exited after" in "\n".join(messages)
    assert any(m.endswith("(failed 5 times in a row): stopping") for m in messages)
    assert any(re.fullmatch(r"worker 0 \(pid \d+\) exited with code -15", m) for m in messages)


async def test_a_worker_deaf_to_sigterm_is_killed_after_the_stop_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    polite = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
    sleep = "time.sleep(60)"
    specs = [_script(sleep, setup=deaf), _script(sleep, setup=polite)]  # set before ready
    caplog.set_level(logging.INFO, "agw.supervisor")
    watched = Supervisor(2, lambda index, generation: specs[index], stop_timeout_s=0.5)
    ready = asyncio.Event()
    running = asyncio.create_task(watched.run(ready.set))
    await asyncio.wait_for(ready.wait(), 30)
    pids = watched.pids
    watched.stop()
    code = await asyncio.wait_for(running, 30)
    assert code == 1  # not every worker stopped cleanly
    messages = [r.getMessage() for r in caplog.records]
    assert f"worker 0 (pid {pids[0]}) still running after 0.5 s: killed" in messages
    assert f"worker 0 (pid {pids[0]}) exited with code -9" in messages
    assert f"worker 1 (pid {pids[1]}) exited with code 0" in messages
    assert "2 workers listening" in messages
