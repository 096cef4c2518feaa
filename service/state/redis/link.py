"""A replica's link to Redis, which every part of its run bus holds.

The client and its pool (commands packed by hiredis: `packing.py`), the key names
under the bus's prefix (`scripts.Keys`), the times the parts keep to, whether the
replica may write (`suspend`, for failure drills), connections of their own for
the outbox and the pub/sub reader, and the `APPEND` script that the outbox, the
declaring of a lost owner and the end of a run that never started all call.

*Redis unreachable.* A call on a request's path (Query, Attach, Submit, Cancel)
that cannot reach Redis — refused, cut, or no answer within the reply time-out —
is refused with `BusUnavailable` (UNAVAILABLE, reason `BUS_UNAVAILABLE`): nothing
was started or changed, and the next call tries again (`reaching`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from service.core.errors import BusUnavailable
from service.core.events import Event
from service.core.run.state import RunState
from service.state.redis import scripts
from service.state.redis.packing import packed
from service.state.redis.scripts import Keys

log = logging.getLogger("agw.bus")

INBOX_POLL_S = 1.0  # an inbox is read with BLPOP for this long at a time
MAX_CONNECTIONS = 1024  # to Redis, per replica (forwarded calls each hold one while waiting)
#: What Redis being unreachable looks like: refused, cut, or no answer in time.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError, TimeoutError)


def default_replica_id() -> str:
    """hostname-pid-random: unique per process, readable in logs."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class Link:
    """One replica's client of the Redis server, and the settings of its run bus."""

    def __init__(
        self,
        url: str,
        *,
        replica_id: str,
        lease_ttl_s: float,
        stream_ttl_s: float,
        lost_ttl_s: float,
        stream_maxlen: int,
        reply_timeout_s: float,
        prefix: str,
    ) -> None:
        self.replica_id = replica_id or default_replica_id()
        self.lease_ttl_s = lease_ttl_s
        self.stream_ttl_s = stream_ttl_s
        self.lost_ttl_s = max(lost_ttl_s, stream_ttl_s)
        self.stream_maxlen = stream_maxlen
        self.reply_timeout_s = reply_timeout_s
        self.keys = Keys(prefix)
        # Reads may block for a while (BLPOP): the socket time-out is beyond them.
        timeout = max(lease_ttl_s, reply_timeout_s, INBOX_POLL_S) + 5.0
        self.socket_timeout_s = timeout  # a reply awaited longer than this: the connection is cut
        self.redis = aioredis.Redis.from_url(
            url,
            protocol=2,
            socket_timeout=timeout,
            socket_connect_timeout=reply_timeout_s,
            max_connections=MAX_CONNECTIONS,
        )
        pool = self.redis.connection_pool
        pool.connection_class = packed(pool.connection_class)
        self.append = self.redis.register_script(scripts.APPEND)
        self.append_many = self.redis.register_script(scripts.APPEND_MANY)
        self._resumed = asyncio.Event()
        self._resumed.set()

    @property
    def lease_ms(self) -> int:
        return max(1, round(self.lease_ttl_s * 1000))

    @property
    def check_s(self) -> float:
        """How long a followed run may make no progress before its owner is checked."""
        return self.lease_ttl_s / 4

    @property
    def end_ms(self) -> int:
        """How long an ended run's stream and meta are kept."""
        return round(self.stream_ttl_s * 1000)

    def suspend(self) -> None:
        """Stop writing to Redis — lease renewals and event appends — as a frozen or cut-off
        process would, until `resume`; the runs go on in this process (failure drills)."""
        self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()

    @property
    def suspended(self) -> bool:
        return not self._resumed.is_set()

    async def writable(self) -> None:
        """Return once this replica may write (at once unless suspended)."""
        await self._resumed.wait()

    def own_connection(self, role: str = "") -> AbstractConnection:
        """A connection of its own (like the pool's): for the pub/sub reader, the outbox;
        with a `role`, named `<prefix><role>:<replica>` (as `CLIENT LIST` shows it)."""
        pool = self.redis.connection_pool
        kwargs = dict(pool.connection_kwargs)
        if role:
            kwargs["client_name"] = f"{self.keys.prefix}{role}:{self.replica_id}"
        return pool.connection_class(**kwargs)

    @contextlib.asynccontextmanager
    async def reaching(self, operation: str, *, timed: bool = True) -> AsyncIterator[None]:
        """Report Redis unreachable inside the block as `BusUnavailable`; `timed`: also when
        the block takes longer than the reply time-out (a frozen or cut-off server)."""
        try:
            if timed:
                async with asyncio.timeout(self.reply_timeout_s):
                    yield
            else:
                yield
        except UNREACHABLE as error:
            what = "no answer in time" if isinstance(error, TimeoutError) else str(error)
            log.warning(
                "replica %s: Redis unreachable during %s (%s)", self.replica_id, operation, what
            )
            raise BusUnavailable(
                f"the run bus (Redis) is unreachable: {type(error).__name__}: {what}; retry",
                operation=operation,
            ) from error

    def claim_argv(self, run: RunState) -> list[Any]:
        """The first arguments of `REGISTER` and `REASSERT` (their order is their ARGV's):
        the run, its chat, owner principal, this replica, the lease and the agent."""
        owner = run.owner
        return [
            run.run_id,
            run.chat_id,
            owner.tenant,
            owner.subject,
            self.replica_id,
            self.lease_ms,
            run.agent_key,
        ]

    def append_argv(
        self,
        fence: Any,
        run_id: str,
        expected: int | str,
        end_ms: int,
        settle_ms: int,
        appended: Sequence[Event] = (),
    ) -> list[Any]:
        """The arguments of the `APPEND` script (their order is its ARGV's)."""
        args: list[Any] = [
            fence,
            self.stream_maxlen,
            run_id,
            expected,
            end_ms,
            settle_ms,
            self.keys.channel(run_id),
        ]
        for event in appended:
            args += [event.seq, event.SerializeToString()]
        return args
