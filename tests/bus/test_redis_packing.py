"""Commands packed by hiredis are byte for byte what redis-py's own packer sends."""

from __future__ import annotations

import hiredis
import pytest
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.exceptions import DataError

from service.state.redis.packing import pack_command, packed

COMMANDS = [
    ("XREAD", "COUNT", 256, "BLOCK", 1000, "STREAMS", "agw:run:a:events", "agw:wake", "0-7", "0-0"),
    ("EVALSHA", "0123abcd", 2, "k1", "k2", b"\x00\xff binary", "text é", 42, -1),
    ("CONFIG GET", "maxmemory"),
    (b"CLIENT SETNAME", "agw"),
    ("SET", "k", memoryview(b"view"), "PX", 1500),
    ("SET", "k", bytearray(b"array")),
    ("PING",),
]


@pytest.mark.parametrize("args", COMMANDS)
def test_same_bytes_as_redis_py(args: tuple[object, ...]) -> None:
    python = Connection()
    assert b"".join(pack_command(*args)) == b"".join(
        bytes(part) for part in python.pack_command(*args)
    )


def test_pipelines_pack_each_command_with_hiredis(monkeypatch: pytest.MonkeyPatch) -> None:
    connection = packed(Connection)()
    expected = b"".join(b"".join(pack_command(*args)) for args in COMMANDS)
    packers: list[tuple[object, ...]] = []
    real = hiredis.pack_command

    def counted(args: tuple[object, ...]) -> bytes:
        packers.append(args)
        return real(args)  # type: ignore[arg-type]

    monkeypatch.setattr(hiredis, "pack_command", counted)
    assert b"".join(bytes(p) for p in connection.pack_commands(COMMANDS)) == expected
    assert len(packers) >= len(COMMANDS)  # every command (a buffer one tried twice)
    assert connection.pack_command("PING") == [b"*1\r\n$4\r\nPING\r\n"]
    assert packers[-1] == (b"PING",)


def test_a_value_redis_cannot_take_is_a_data_error() -> None:
    with pytest.raises(DataError):
        pack_command("SET", "k", object())


def test_the_connection_kind_is_kept() -> None:
    assert issubclass(packed(Connection), Connection)
    assert issubclass(packed(UnixDomainSocketConnection), UnixDomainSocketConnection)
    assert packed(Connection) is packed(Connection)
