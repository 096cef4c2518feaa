"""The Redis run bus from the settings: `AGW_RUN_BUS=redis` and its knobs reach the bus."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest
from pydantic import SecretStr

from service.assembly.app import App
from service.assembly.config import Settings
from service.state import RUN_BUSES, StateOptions
from service.state.redis.bus import RedisRunBus


async def test_the_settings_reach_the_redis_bus(tmp_path: Path) -> None:
    settings = Settings(
        grpc_address="127.0.0.1:0",
        data_dir=tmp_path,
        run_bus="redis",
        redis_url=SecretStr("redis://:s3cret@127.0.0.1:1/2"),
        replica_id="replica-7",
        redis_lease_ttl_s=3.0,
        redis_stream_ttl_s=90.0,
        redis_stream_maxlen=500,
        redis_reply_timeout_s=1.5,
        run_archive_ttl_s=3600.0,
        frontend_wait_timeout_s=42.0,
        submit_payload_limit_bytes=99,
    )
    bus = App(settings).bus
    assert isinstance(bus, RedisRunBus)
    link = bus.link
    assert (bus.replica_id, link.lease_ttl_s, link.stream_ttl_s, link.lost_ttl_s) == (
        "replica-7",
        3.0,
        90.0,
        3600.0,
    )
    assert (link.stream_maxlen, link.reply_timeout_s) == (500, 1.5)
    assert (bus.waits.timeout_s, bus.waits.payload_limit_bytes) == (42.0, 99)
    kwargs = bus.redis.connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"], kwargs["password"]) == (
        "127.0.0.1",
        1,
        2,
        "s3cret",
    )
    assert "s3cret" not in repr(settings) and "s3cret" not in repr(
        StateOptions(tmp_path, tmp_path, redis_url="redis://:s3cret@h/0")
    )


def test_a_replica_is_named_by_host_process_and_chance_unless_told() -> None:
    options = StateOptions(Path("c"), Path("r"))
    first, second = (RUN_BUSES["redis"](options) for _ in range(2))
    assert isinstance(first, RedisRunBus) and isinstance(second, RedisRunBus)
    pattern = rf"{re.escape(socket.gethostname())}-{os.getpid()}-[0-9a-f]{{6}}"
    assert re.fullmatch(pattern, first.replica_id)
    assert first.replica_id != second.replica_id


def test_the_bus_is_chosen_by_name() -> None:
    with pytest.raises(ValueError, match="run_bus"):
        Settings(run_bus="zookeeper")  # type: ignore[arg-type]
