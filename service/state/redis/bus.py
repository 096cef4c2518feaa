"""The Redis-backed `RunBus`: any replica follows, answers and cancels any run.

The replica that executes a run (its *owner*) keeps it in its process as
the in-process bus does, and publishes every event of it to Redis; every other
replica reads the run from there. The keys and scripts are in
`scripts.py`: per run a stream of its events (entry id `0-<seq>`), a meta
hash (chat, owner principal, owner replica, status, fence token) and a lease;
per chat its active run (claimed with SET NX) and a settling mark; per replica
a liveness key and an inbox.

*Waits.* The owner writes the open waits of each run (tool id, kind, tool name) into
its meta hash whenever one opens or closes (one writer loop per replica, which writes
each run's latest state), so any replica can say what a live run waits for
(`live_of`), with the stream's last entry as its last seq.

*Events.* The owner's outbox (`streams.Outbox`) observes each run's log
and appends what waits, every run's events in one pipelined round trip on a
connection of its own, with a script that first checks the run's fence and
also publishes the events it added on the run's channel. The terminal event's
append also marks the run ended, frees the chat (marking it settling until
`settled`) and gives the stream and meta their expiry. Another replica follows
a run through a mirror (`streams.Mirror`): it subscribes to the run's
channel on its one pub/sub connection (`streams.Subscriber`) first, then
reads the stream so far (`XRANGE`); the pushes fill the mirror from there,
duplicates dropped. The stream stays the record: a gap in the pushed seqs, a
new pub/sub connection (the last one cut, also by Redis for a full output
buffer) or a followed run that made no progress has the mirror read its stream
again after its last event.

*Owner failure.* The owner renews the lease of each live run every third of
its time to live. The mirrors' check (for a followed run that made no progress
for a quarter of the lease), a query meeting the chat's active run, a Submit or a
Cancel, `wait_ended`, and each replica's janitor (every lease period, over the
runs not ended) check the lease; when it has expired, one of them declares the
owner lost atomically (the lease is gone and the run has not ended: the fence
is incremented, the status is `lost`, the declarer holds the lease), replays
the stream to find the blocks still open, and appends their `*.end`s and a
terminal `run.error` with reason `OWNER_LOST` — with the new fence, and only if
the stream still ends where it read it. A declarer that dies in between lets
its lease expire and another one does it again. An owner that comes back has
its appends and renewals refused by the fence: it cancels its run (reason
"fenced") and writes nothing more of it (`RunState.fenced`).

*Submit and Cancel* for a run of another replica go to that replica's inbox
with a reply key, and a key saying the request is still wanted; the owner takes
that key, applies the request as the in-process bus would, and pushes the
answer. When the owner does not answer within the reply time-out, the caller
takes the key back (a request given up on is never applied later): if the
owner's lease has expired the run is ended as lost (Submit answers `EXPIRED`,
Cancel True); otherwise the call is refused with `OWNER_LOST` (UNAVAILABLE:
nothing was done; retry).

*Redis unreachable.* A call on a request's path (Query, Attach, Submit, Cancel)
that cannot reach Redis — refused, cut, or no answer within the reply time-out —
is refused with `BusUnavailable` (UNAVAILABLE, reason `BUS_UNAVAILABLE`): nothing
was started or changed, and the next call tries again. Runs in flight go on on
their owner, whose clients see them end as usual; the outbox keeps their events
and appends them once Redis answers again, so followers on other replicas, which
wait meanwhile, get them then, each with the run's one terminal event.

A single Redis server (or primary) is assumed, not Redis Cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson
import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from service.core import events
from service.core.commands import Principal, SubmitCommand, SubmitResult
from service.core.errors import STATUS_OF, AgwError, BusUnavailable, Conflict, OwnerLost
from service.core.eventlog import Emitter
from service.core.events import BLOCK_ENDS, BLOCKS, EVENT_TYPES, Event
from service.core.ids import valid_run_id
from service.core.ports import LiveRun, RunRef
from service.core.runstate import RunState
from service.core.waits import WAIT_KINDS, OpenWait, WaitKind, Waits
from service.state.redis import scripts
from service.state.redis.packing import packed
from service.state.redis.scripts import ENDED, LOST, RUNNING, Keys
from service.state.redis.streams import Mirror, Outbox, Owned, Subscriber
from service.state.run_refs import live, ref

log = logging.getLogger("agw.bus")

SETTLE_MARK_S = 30.0  # a settling mark outlives an owner that died before settling
SETTLE_WAIT_S = 10.0  # a new run waits at most this long for the chat's last run to settle
INBOX_POLL_S = 1.0  # an inbox is read with BLPOP for this long at a time
MIRROR_LINGER_S = 10.0  # a mirror nobody follows is dropped after this long
CLOSE_WAIT_S = 5.0  # how long `close` waits for its tasks to stop
MAX_CONNECTIONS = 1024  # to Redis, per replica (forwarded calls each hold one while waiting)
#: Why a lost run's tools stopped waiting.
GONE = "the run ended: the replica executing it was lost"
#: What Redis being unreachable looks like: refused, cut, or no answer in time.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError, TimeoutError)


def default_replica_id() -> str:
    """hostname-pid-random: unique per process, readable in logs."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


def _open_waits(data: bytes | None) -> list[OpenWait]:
    """The open waits a meta hash holds (`[[tool id, kind, tool name], ...]`)."""
    waits = orjson.loads(data) if data else []
    return [
        OpenWait(tool_id, cast(WaitKind, kind), name)
        for tool_id, kind, name in waits
        if kind in WAIT_KINDS  # a kind this version does not know is left out
    ]


def _events_of(entries: Any) -> list[Event]:
    """The events of stream entries (`[(id, {b"e": data})]`)."""
    return [Event.FromString(fields[b"e"]) for _entry_id, fields in entries]


@dataclass(frozen=True, slots=True)
class _Meta:
    """A run as its meta hash describes it."""

    run_id: str
    chat_id: str
    owner: Principal
    replica: str
    status: str

    @property
    def ref(self) -> RunRef:
        return RunRef(self.run_id, self.chat_id, self.owner, running=self.status != ENDED)


#: The errors an owner may answer a forwarded Submit with, by reason.
_ERRORS: dict[str, type[AgwError]] = {
    cls.reason: cls for cls in STATUS_OF if cls.__init__ is AgwError.__init__
}


class RedisRunBus:
    """The live runs of every replica, through one Redis server."""

    def __init__(
        self,
        url: str,
        *,
        replica_id: str = "",
        waits: Waits | None = None,
        lease_ttl_s: float = 10.0,
        stream_ttl_s: float = 600.0,
        lost_ttl_s: float = 7 * 86400.0,
        stream_maxlen: int = 100_000,
        reply_timeout_s: float = 5.0,
        prefix: str = "agw:",
    ) -> None:
        """`lease_ttl_s`: how long a silent owner keeps its runs; `stream_ttl_s`: how long
        an ended run's stream is kept (`lost_ttl_s` for a run whose owner was lost: no
        run log has it); `reply_timeout_s`: how long a forwarded Submit or Cancel waits."""
        self.replica_id = replica_id or default_replica_id()
        self.waits = waits if waits is not None else Waits()
        self.lease_ttl_s = lease_ttl_s
        self.stream_ttl_s = stream_ttl_s
        self.lost_ttl_s = max(lost_ttl_s, stream_ttl_s)
        self.stream_maxlen = stream_maxlen
        self.reply_timeout_s = reply_timeout_s
        self.keys = Keys(prefix)
        # Reads may block for a while (BLPOP): the socket time-out is beyond them.
        timeout = max(lease_ttl_s, reply_timeout_s, INBOX_POLL_S) + 5.0
        self.redis = aioredis.Redis.from_url(
            url,
            protocol=2,
            socket_timeout=timeout,
            socket_connect_timeout=reply_timeout_s,
            max_connections=MAX_CONNECTIONS,
        )
        pool = self.redis.connection_pool
        pool.connection_class = packed(pool.connection_class)
        self._register = self.redis.register_script(scripts.REGISTER)
        self._append = self.redis.register_script(scripts.APPEND)
        self._renew = self.redis.register_script(scripts.RENEW)
        self._declare = self.redis.register_script(scripts.DECLARE)
        self._active = self.redis.register_script(scripts.ACTIVE)
        self._compare_delete = self.redis.register_script(scripts.COMPARE_DELETE)
        self._set_waits = self.redis.register_script(scripts.SET_WAITS)
        self._waits_due: dict[str, list[OpenWait]] = {}  # run id -> its waits to write
        self._waits_wake = asyncio.Event()
        self.waits.observe(self._waits_changed)
        self._runs: dict[str, Owned] = {}
        self._freed: dict[str, asyncio.Event] = {}  # run id -> set once the run ended
        self._mirrors: dict[str, Mirror] = {}
        self._loading: dict[str, asyncio.Task[Mirror | None]] = {}  # mirrors being made
        self._channels: dict[bytes, Mirror] = {}  # channel -> the mirror its pushes fill
        self._subscriber = Subscriber(
            self._own_connection, self._pushed, self._resubscribed, self._check_s
        )
        self._tasks: set[asyncio.Task[None]] = set()  # streams being read after a lost push
        self._appender = self._own_connection()  # the outbox's, one append at a time
        self._outbox = Outbox(self._append_batches, self._fence, self._unknown, self.writable)
        self._loops: list[asyncio.Task[None]] = []
        self._declaring: set[asyncio.Task[bool]] = set()
        self._resumed = asyncio.Event()
        self._resumed.set()

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def wait_timeout_s(self) -> float:
        return self.waits.timeout_s

    @property
    def _lease_ms(self) -> int:
        return max(1, round(self.lease_ttl_s * 1000))

    @property
    def _check_s(self) -> float:
        """How long a followed run may make no progress before its owner is checked."""
        return self.lease_ttl_s / 4

    async def open(self) -> None:
        await self.redis.set(self.keys.alive(self.replica_id), "1", px=self._lease_ms)
        for script in (scripts.APPEND, scripts.RENEW):  # called with EVALSHA in pipelines
            await self.redis.script_load(script)
        self._outbox.start()
        loops = {
            "leases": self._renew_leases,
            "inbox": self._serve_inbox,
            "janitor": self._janitor,
            "reader": self._read_pushed,
            "mirrors": self._watch_mirrors,
            "waits": self._write_waits,
        }
        self._loops = [
            asyncio.create_task(self._forever(name, step), name=f"{name}-{self.replica_id}")
            for name, step in loops.items()
        ]
        log.info("run bus on Redis as replica %s", self.replica_id)

    async def close(self) -> None:
        tasks = [*self._loops, *self._declaring, *self._tasks, *self._loading.values()]
        if self._outbox.task is not None:
            tasks.append(self._outbox.task)
        for task in tasks:
            task.cancel()
        if tasks:  # a task that does not stop is named, not waited for forever
            stopped, stuck = await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)
            for task in stopped:
                if not task.cancelled():
                    task.exception()  # retrieved: whatever it ended with is over
            for task in stuck:
                stack = io.StringIO()
                task.print_stack(file=stack)
                where = stack.getvalue()
                log.warning("replica %s: a task did not stop at close: %s", self.replica_id, where)
        await self._subscriber.close()
        await self._appender.disconnect(nowait=True)
        self._loops = []
        self._channels.clear()  # the subscriber is closed: nothing to unsubscribe from
        for mirror in self._mirrors.values():
            mirror.finish()
        try:
            await self.redis.delete(self.keys.alive(self.replica_id))
        except (RedisError, OSError) as error:
            log.warning("replica %s: could not sign off (%s)", self.replica_id, error)
        await self.redis.aclose()

    async def _forever(self, what: str, step: Callable[[], Awaitable[None]]) -> None:
        """Run `step` again and again; a failure is logged once, and `step` retried after a
        pause that grows while Redis stays unreachable (0.2 s up to 2 s)."""
        failures = 0
        while True:
            try:
                await step()
            except (RedisError, OSError) as error:
                if not failures:
                    log.warning("%s of replica %s: %s", what, self.replica_id, error)
                failures += 1
                await asyncio.sleep(min(0.2 * 2 ** (failures - 1), 2.0))
                continue
            except Exception:
                log.exception("%s of replica %s failed", what, self.replica_id)
                await asyncio.sleep(0.2)
                continue
            if failures:
                log.info("%s of replica %s: Redis answers again", what, self.replica_id)
                failures = 0

    def suspend(self) -> None:
        """Stop writing to Redis — lease renewals and event appends — as a frozen or cut-off
        process would, until `resume`; the runs go on in this process (failure drills)."""
        self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()

    async def writable(self) -> None:
        """Return once this replica may write (at once unless suspended)."""
        await self._resumed.wait()

    def _own_connection(self) -> AbstractConnection:
        """A connection of its own (like the pool's): for the pub/sub reader, the outbox."""
        pool = self.redis.connection_pool
        return pool.connection_class(**pool.connection_kwargs)

    @contextlib.asynccontextmanager
    async def _reaching(self, operation: str, *, timed: bool = True) -> AsyncIterator[None]:
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

    # -- the owner's side --------------------------------------------------------------

    async def register(self, run: RunState) -> RunRef | None:
        async with self._reaching("register"):
            return await self._register_run(run)

    async def _register_run(self, run: RunState) -> RunRef | None:
        for _ in range(5):
            clash = _text(
                await self._register(
                    keys=[
                        self.keys.claim(run.chat_id),
                        self.keys.meta(run.run_id),
                        self.keys.lease(run.run_id),
                        self.keys.active,
                    ],
                    args=[
                        run.run_id,
                        run.chat_id,
                        run.owner.tenant,
                        run.owner.subject,
                        self.replica_id,
                        self._lease_ms,
                        run.agent_key,
                    ],
                )
            )
            if not clash:
                owned = Owned(run, fence=1)
                run.log.observe(functools.partial(self._outbox.push, owned))
                self._runs[run.run_id] = owned
                self._freed[run.run_id] = asyncio.Event()
                return None
            active = await self.active_of(run.chat_id)
            if active is not None:
                return active
        raise Conflict(f"chat {run.chat_id!r} changed hands too often; retry", chat_id=run.chat_id)

    def _append_args(self, owned: Owned, batch: Sequence[Event]) -> list[Any]:
        terminal = bool(batch) and batch[-1].WhichOneof("payload") in events.TERMINALS
        end_ms = round(self.stream_ttl_s * 1000) if terminal else 0
        settle_ms = round(SETTLE_MARK_S * 1000)
        return self._append_argv(owned.fence, owned.run.run_id, "", end_ms, settle_ms, batch)

    def _append_argv(
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

    async def _append_batches(self, batches: Sequence[tuple[Owned, list[Event]]]) -> list[object]:
        """Append each run's batch under its fence, all in one round trip (the outbox's),
        on the outbox's own connection: the commands packed at once, the answers read."""
        commands = []
        for owned, batch in batches:
            keys = self.keys.appending(owned.run.run_id, owned.run.chat_id)
            args = self._append_args(owned, batch)
            commands.append(("EVALSHA", self._append.sha, len(keys), *keys, *args))
        conn = self._appender
        results: list[object] = []
        try:
            if not conn.is_connected:
                await conn.connect()  # type: ignore[no-untyped-call]
            await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            for _command in commands:
                try:
                    results.append(int(await conn.read_response()))
                except ResponseError as error:
                    results.append(error)
        except BaseException:
            await conn.disconnect(nowait=True)  # answers may be left unread on it
            raise
        if any(isinstance(result, NoScriptError) for result in results):
            await self.redis.script_load(scripts.APPEND)  # the server lost its scripts
        return results

    def _fence(self, owned: Owned) -> None:
        """Another replica declared this one lost for the run: stop it here, write nothing."""
        if owned.fenced:
            return
        owned.fenced = True
        owned.run.fenced = True
        owned.pending.clear()
        owned.drained.set()
        log.warning(
            "run %s was taken over by another replica (this one was declared lost); "
            "cancelling it here",
            owned.run.run_id,
        )
        owned.run.cancel("fenced")
        freed = self._freed.pop(owned.run.run_id, None)
        if freed is not None:
            freed.set()

    def _unknown(self, owned: Owned) -> None:
        """Redis no longer knows the run (it restarted empty, or its keys were dropped): the
        run goes on here, but nothing more of it is published; followers elsewhere end it."""
        if not owned.live:
            return
        log.warning(
            "run %s: Redis no longer knows the run (its data was lost); not publishing it",
            owned.run.run_id,
        )
        owned.published_end = True  # nothing more to append or renew
        owned.pending.clear()
        owned.drained.set()

    async def ended(self, run: RunState) -> None:
        try:
            await self._end(run)
        except UNREACHABLE as error:  # the outbox appends the terminal event once Redis is back
            log.warning("run %s ended; Redis unreachable to mark it (%s)", run.run_id, error)
            freed = self._freed.pop(run.run_id, None)
            if freed is not None:
                freed.set()

    async def _end(self, run: RunState) -> None:
        owned = self._runs.get(run.run_id)
        if owned is not None and owned.live:
            await owned.wait_drained(self.reply_timeout_s)
            if owned.live:  # no terminal event went out (the run never started)
                await self._append(
                    keys=self.keys.appending(run.run_id, run.chat_id),
                    args=self._append_argv(owned.fence, run.run_id, "", self._end_ms, 0),
                )
                owned.published_end = True
        freed = self._freed.pop(run.run_id, None)
        if freed is not None:
            freed.set()

    @property
    def _end_ms(self) -> int:
        return round(self.stream_ttl_s * 1000)

    async def settled(self, run: RunState) -> None:
        owned = self._runs.get(run.run_id)
        if owned is not None and owned.fenced:
            return
        try:
            await self._compare_delete(keys=[self.keys.settling(run.chat_id)], args=[run.run_id])
        except UNREACHABLE as error:  # the settling mark expires by itself
            log.warning("run %s settled; Redis unreachable to say so (%s)", run.run_id, error)

    async def release(self, run_id: str) -> None:
        freed = self._freed.pop(run_id, None)
        if freed is not None:
            freed.set()
        self._runs.pop(run_id, None)
        self.waits.forget(run_id)

    def local(self, run_id: str) -> RunState | None:
        owned = self._runs.get(run_id)
        return owned.run if owned is not None else None

    def local_runs(self) -> Mapping[str, RunState]:
        return {run_id: owned.run for run_id, owned in self._runs.items()}

    def _here(self, run_id: str) -> RunState | None:
        """The run when this replica executes it (and was not fenced out of it)."""
        owned = self._runs.get(run_id)
        return owned.run if owned is not None and not owned.fenced else None

    async def _renew_leases(self) -> None:
        """After a third of the lease: renew the leases of the live runs, and this replica's
        liveness; a run whose fence changed was taken over, and is fenced here."""
        await asyncio.sleep(self.lease_ttl_s / 3)
        await self.writable()
        owned = [o for o in self._runs.values() if o.live]
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.keys.alive(self.replica_id), "1", px=self._lease_ms)
        for o in owned:
            run_id = o.run.run_id
            lease = f"{self.replica_id}:{o.fence}"
            keys = (self.keys.meta(run_id), self.keys.lease(run_id))
            pipe.evalsha(self._renew.sha, 2, *keys, o.fence, lease, self._lease_ms)
        results = await pipe.execute(raise_on_error=False)
        if any(isinstance(result, NoScriptError) for result in results):
            await self.redis.script_load(scripts.RENEW)
            return
        for o, renewed in zip(owned, results[1:], strict=True):
            if isinstance(renewed, Exception):
                log.warning("cannot renew the lease of run %s (%s)", o.run.run_id, renewed)
            elif int(renewed) == scripts.GONE:
                self._unknown(o)
            elif not int(renewed):
                self._fence(o)

    async def _serve_inbox(self) -> None:
        """Apply a Submit or Cancel another replica sent for a run of this one, if any."""
        item = await self.redis.blpop([self.keys.inbox(self.replica_id)], timeout=INBOX_POLL_S)
        if item is None:
            return
        request = orjson.loads(item[1])
        if not await self.redis.delete(request["want"]):
            return  # its caller gave up on it
        answer = self._answer(request)
        pipe = self.redis.pipeline(transaction=False)
        pipe.rpush(request["reply"], orjson.dumps(answer))
        pipe.pexpire(request["reply"], round(self.reply_timeout_s * 2000))
        await pipe.execute()

    def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """What this replica answers a forwarded request with."""
        if request["op"] == "cancel":
            run = self._here(request["run_id"])
            return {"cancelled": run.cancel(request["reason"]) if run is not None else None}
        command = SubmitCommand(
            run_id=request["run_id"],
            tool_id=request["tool_id"],
            payload=request.get("payload"),
            chat_id=request.get("chat_id", ""),
            request_id=request.get("request_id", ""),
            view_id=request.get("view_id", ""),
            principal=Principal(request.get("tenant", ""), request.get("subject", "")),
        )
        try:
            result = self._submit_here(command)
        except AgwError as error:
            return {
                "error": {
                    "reason": error.reason,
                    "message": error.message,
                    "metadata": error.metadata,
                }
            }
        return {"outcome": result.outcome, "detail": result.detail}

    def _submit_here(self, command: SubmitCommand) -> SubmitResult:
        return self.waits.deliver(command, self._here(command.run_id) if command.run_id else None)

    async def wait(
        self,
        out: Emitter,
        tool_id: str,
        tool_name: str,
        timeout_s: float | None = None,
        *,
        kind: WaitKind = "frontend_tool",
    ) -> Any:
        return await self.waits.wait(out, tool_id, tool_name, timeout_s, kind=kind)

    def _waits_changed(self, run_id: str, waits: list[OpenWait]) -> None:
        if run_id in self._runs:
            self._waits_due[run_id] = waits
            self._waits_wake.set()

    async def _write_waits(self) -> None:
        """Write the open waits of the runs whose waits changed into their meta hashes."""
        await self._waits_wake.wait()
        await self.writable()
        self._waits_wake.clear()
        due, self._waits_due = self._waits_due, {}
        try:
            for run_id, waits in list(due.items()):
                owned = self._runs.get(run_id)
                if owned is not None and not owned.fenced:
                    data = orjson.dumps([[w.tool_id, w.kind, w.tool_name] for w in waits])
                    await self._set_waits(keys=[self.keys.meta(run_id)], args=[data, owned.fence])
                del due[run_id]  # written, or nothing to write any more
        finally:
            if due:  # not written (Redis unreachable): again, unless newer ones came meanwhile
                self._waits_due = {**due, **self._waits_due}
                self._waits_wake.set()

    def waiting(self, run_id: str) -> list[str]:
        return self.waits.waiting(run_id)

    # -- anyone's side: finding and following ------------------------------------------

    async def _meta(self, run_id: str) -> _Meta | None:
        if not valid_run_id(run_id):
            return None
        data = await self.redis.hgetall(self.keys.meta(run_id))
        if not data:
            return None
        fields = {_text(k): _text(v) for k, v in data.items()}
        return _Meta(
            run_id,
            fields.get("chat", ""),
            Principal(fields.get("tenant", ""), fields.get("subject", "")),
            fields.get("replica", ""),
            fields.get("status", ""),
        )

    async def find(self, run_id: str) -> RunRef | None:
        run = self._here(run_id)
        if run is not None:
            return ref(run)
        async with self._reaching("find"):
            meta = await self._meta(run_id)
        return meta.ref if meta is not None else None

    async def active_of(self, chat_id: str) -> RunRef | None:
        async with self._reaching("active_of"):
            return await self._active_of(chat_id)

    async def _active_of(self, chat_id: str) -> RunRef | None:
        for _ in range(5):
            found = await self._active(keys=[self.keys.claim(chat_id)], args=[self.keys.prefix])
            if not found:
                return None
            run_id, chat, tenant, subject, status = (_text(value) for value in found[:5])
            run = self._here(run_id)
            if run is not None:
                return ref(run)
            if not status:  # the claim outlived its run's meta: drop it
                await self._compare_delete(keys=[self.keys.claim(chat_id)], args=[run_id])
                continue
            if status != ENDED and not int(found[5]) and await self.declare_lost(run_id):
                continue  # its owner was lost: the run is ended and the chat freed
            return RunRef(run_id, chat, Principal(tenant, subject), running=status != ENDED)
        return None

    async def live_of(self, chat_id: str) -> LiveRun | None:
        async with self._reaching("live_of"):
            active = await self._active_of(chat_id)
            if active is None or not active.running:
                return None
            run = self._here(active.run_id)
            if run is not None:
                return live(run, self.waits) if not run.done else None
            pipe = self.redis.pipeline(transaction=False)
            pipe.hmget(self.keys.meta(active.run_id), "status", "agent", "waits")
            pipe.xrevrange(self.keys.events(active.run_id), "+", "-", count=1)
            (status, agent, waits), last = await pipe.execute()
        if _text(status) != RUNNING:
            return None
        last_seq = int(_text(last[0][0]).partition("-")[2]) if last else 0
        return LiveRun(
            active.run_id, chat_id, active.owner, _text(agent), last_seq, _open_waits(waits)
        )

    async def wait_ended(self, run_id: str) -> None:
        if self._here(run_id) is not None:
            freed = self._freed.get(run_id)
            if freed is not None:
                await freed.wait()
            return
        delay = 0.005
        while True:
            pipe = self.redis.pipeline(transaction=True)
            pipe.hget(self.keys.meta(run_id), "status")
            pipe.exists(self.keys.lease(run_id))
            async with self._reaching("wait_ended"):
                status, leased = await pipe.execute()
            if status is None or _text(status) == ENDED:
                return
            if not leased:
                await self.declare_lost(run_id)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)

    async def wait_settled(self, chat_id: str) -> None:
        deadline = time.monotonic() + SETTLE_WAIT_S
        delay = 0.002
        while True:
            async with self._reaching("wait_settled"):
                if not await self.redis.exists(self.keys.settling(chat_id)):
                    return
            if time.monotonic() >= deadline:
                log.warning("chat %s: its last run did not settle in %gs", chat_id, SETTLE_WAIT_S)
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    async def follow(self, run_id: str, after_seq: int) -> AsyncGenerator[Event, None] | None:
        run = self._here(run_id)
        if run is not None:
            return run.follow(after_seq)
        async with self._reaching("follow"):
            mirror = await self._mirror(run_id)
        return mirror.follow(after_seq) if mirror is not None else None

    async def _mirror(self, run_id: str) -> Mirror | None:
        """The run of another replica as this one follows it (read so far); None: unknown."""
        mirror = self._mirrors.get(run_id)
        if mirror is not None or not valid_run_id(run_id):
            return mirror
        loading = self._loading.get(run_id)
        if loading is None:  # one load per run, whoever asks meanwhile
            loading = asyncio.create_task(self._load_mirror(run_id))
            self._loading[run_id] = loading
            loading.add_done_callback(lambda _: self._loading.pop(run_id, None))
        return await asyncio.shield(loading)

    async def _load_mirror(self, run_id: str) -> Mirror | None:
        """Subscribe to the run's channel, then read its stream: an event is in one or the
        other (or both: the mirror drops duplicates)."""
        mirror = Mirror(run_id)
        mirror.on_done = self._unsubscribe  # nothing more to push once the run ended
        channel = self.keys.channel(run_id).encode()
        self._channels[channel] = mirror  # what is pushed from now on waits in it
        try:
            await self._subscriber.subscribe(channel)
            connection = self._subscriber.connections
            pipe = self.redis.pipeline(transaction=True)  # what is there, and the status, at once
            pipe.xrange(self.keys.events(run_id))
            pipe.hget(self.keys.meta(run_id), "status")
            entries, status = await pipe.execute()
        except BaseException:
            self._unsubscribe(mirror)
            raise
        if status is None and not entries:
            self._unsubscribe(mirror)
            return None
        gap = mirror.load(_events_of(entries), done=status is None or _text(status) == ENDED)
        if gap or connection != self._subscriber.connections:  # pushes may have been lost
            self._catch_up(mirror)
        mirror.on_idle = self._idle_mirror
        self._mirrors[run_id] = mirror
        return mirror

    def _unsubscribe(self, mirror: Mirror) -> None:
        channel = self.keys.channel(mirror.run_id).encode()
        if self._channels.get(channel) is mirror:
            del self._channels[channel]
            self._subscriber.unsubscribe(channel)

    def _idle_mirror(self, mirror: Mirror) -> None:
        if mirror.done:  # a run still going keeps its mirror a while, for re-attaching
            self._drop_mirror(mirror)

    def _drop_mirror(self, mirror: Mirror) -> None:
        self._unsubscribe(mirror)
        if self._mirrors.get(mirror.run_id) is mirror:
            del self._mirrors[mirror.run_id]

    def _pushed(self, channel: bytes, data: bytes) -> None:
        """Events an owner appended, pushed on the run's channel: into its mirror."""
        mirror = self._channels.get(channel)
        if mirror is None:
            return  # unsubscribed meanwhile
        gap = mirror.offer(scripts.unpack_pushed(data))
        if gap and mirror.loaded:  # a push was lost: read the stream from the mirror's last
            self._catch_up(mirror)

    def _resubscribed(self) -> None:
        """A new pub/sub connection has every channel again: what was pushed meanwhile is
        read from the streams."""
        for mirror in self._channels.values():
            if mirror.loaded and not mirror.done:
                self._catch_up(mirror)

    def _catch_up(self, mirror: Mirror) -> None:
        if mirror.catching_up or mirror.done:
            return
        mirror.catching_up = True
        task = asyncio.create_task(self._read_after(mirror))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read_after(self, mirror: Mirror) -> None:
        """Read the mirror's stream after its last event, until no push waits behind a gap
        (a failure is left to the check of the mirrors that make no progress)."""
        try:
            for _ in range(3):
                entries = await self.redis.xrange(
                    self.keys.events(mirror.run_id), min=f"(0-{mirror.last}"
                )
                gap = mirror.extend(_events_of(entries))
                if not gap or not entries:
                    return
        except (RedisError, OSError) as error:
            log.warning("run %s: cannot read its stream (%s)", mirror.run_id, error)
        finally:
            mirror.catching_up = False

    async def _read_pushed(self) -> None:
        """The pub/sub connection's life (see `Subscriber`)."""
        await self._subscriber.run()

    async def _watch_mirrors(self) -> None:
        """Twice per check period: look at the followed runs."""
        await asyncio.sleep(self._check_s / 2)
        await self._check_mirrors()

    async def _check_mirrors(self) -> None:
        """Look at the owners of the followed runs that made no progress for a while, and
        drop the mirrors nobody followed for a while."""
        now = time.monotonic()
        for mirror in list(self._mirrors.values()):
            unfollowed = mirror.followers == 0 and now - mirror.idle_since > MIRROR_LINGER_S
            if unfollowed or (mirror.done and now - mirror.progress_at > MIRROR_LINGER_S):
                self._drop_mirror(mirror)  # a reader still on a mirror that is done keeps it
        stalled = [
            m for m in self._mirrors.values() if not m.done and now - m.progress_at >= self._check_s
        ]
        if not stalled:
            return
        pipe = self.redis.pipeline(transaction=True)
        for mirror in stalled:
            pipe.xrange(self.keys.events(mirror.run_id), min=f"(0-{mirror.last}", count=1)
            pipe.hget(self.keys.meta(mirror.run_id), "status")
            pipe.exists(self.keys.lease(mirror.run_id))
        results = await pipe.execute()
        for n, mirror in enumerate(stalled):
            entries, status, leased = results[3 * n : 3 * n + 3]
            mirror.progress_at = now
            if entries:  # pushes were lost: read them from the stream
                self._catch_up(mirror)
            elif status is None and mirror.events:  # Redis lost the run (restarted empty)
                mirror.extend(_vanished(mirror))
            elif status is None or _text(status) == ENDED:
                mirror.finish()  # nothing after what was read, and nothing more will come
            elif not leased:
                task = asyncio.create_task(self.declare_lost(mirror.run_id))
                self._declaring.add(task)
                task.add_done_callback(self._declaring.discard)

    # -- owner failure -----------------------------------------------------------------

    async def declare_lost(self, run_id: str) -> bool:
        """End the run as lost when its owner's lease expired; True when this replica did."""
        fence = int(
            await self._declare(
                keys=[self.keys.meta(run_id), self.keys.lease(run_id), self.keys.active],
                args=[run_id, self.replica_id, self._lease_ms],
            )
        )
        if not fence:
            return False
        meta = await self._meta(run_id)
        if meta is None:
            return False
        logged = _events_of(await self.redis.xrange(self.keys.events(run_id)))
        lost = OwnerLost(
            f"replica {meta.replica} executing the run was lost (its lease expired)",
            replica=meta.replica,
        )
        closing = _closing_events(meta.run_id, meta.chat_id, logged, lost)
        top = logged[-1].seq if logged else 0
        lost_ms = round(self.lost_ttl_s * 1000)
        args = self._append_argv(fence, run_id, top, lost_ms, 0, closing)
        keys = self.keys.appending(run_id, meta.chat_id)
        appended = int(await self._append(keys=keys, args=args)) == 1
        if appended:
            log.warning(
                "run %s: replica %s was lost (its lease expired); ended the run as OWNER_LOST",
                run_id,
                meta.replica,
            )
        return appended

    async def _janitor(self) -> None:
        """About every lease period: end the runs of other replicas whose lease expired,
        also those nobody follows."""
        await asyncio.sleep(self.lease_ttl_s * (0.75 + secrets.randbelow(500) / 1000))
        members = await self.redis.smembers(self.keys.active)
        others = [_text(m) for m in members if _text(m) not in self._runs]
        if not others:
            return
        pipe = self.redis.pipeline(transaction=False)
        for run_id in others:
            pipe.exists(self.keys.lease(run_id))
        leased = await pipe.execute()
        for run_id, alive in zip(others, leased, strict=True):
            if not alive:
                await self.declare_lost(run_id)

    # -- Submit and Cancel from anywhere -----------------------------------------------

    async def submit(self, command: SubmitCommand) -> SubmitResult:
        if not command.run_id or self._here(command.run_id) is not None:
            return self._submit_here(command)
        self.waits.check(command)
        async with self._reaching("submit"):
            meta = await self._meta(command.run_id)
        async with self._reaching("submit", timed=False):  # the owner's answer bounds it
            return await self._forward_submit(command, meta)

    async def _forward_submit(self, command: SubmitCommand, meta: _Meta | None) -> SubmitResult:
        if (
            meta is None
            or (command.chat_id and command.chat_id != meta.chat_id)
            or meta.owner != command.principal
        ):
            return self.waits.submit(command, run_known=False)
        gone = SubmitResult("EXPIRED", f"tool {command.tool_id!r} stopped waiting ({GONE})")
        if meta.status == LOST or (meta.status == RUNNING and await self._lost(meta)):
            return gone
        if not await self.redis.exists(self.keys.alive(meta.replica)):  # ended, owner gone
            return SubmitResult("EXPIRED", f"tool {command.tool_id!r} stopped waiting (run ended)")
        request = {
            "op": "submit",
            "run_id": command.run_id,
            "tool_id": command.tool_id,
            "payload": command.payload,
            "chat_id": command.chat_id,
            "request_id": command.request_id,
            "view_id": command.view_id,
            "tenant": command.principal.tenant,
            "subject": command.principal.subject,
        }
        answer = await self._ask(meta, request)
        if answer is None:
            if await self._lost(meta):
                return gone
            raise self._unanswered(meta)
        if "error" in answer:
            error = answer["error"]
            cls = _ERRORS.get(error["reason"], AgwError)
            raise cls(error["message"], **error.get("metadata", {}))
        return SubmitResult(answer["outcome"], answer["detail"])

    async def cancel(self, run_id: str, reason: str) -> bool | None:
        run = self._here(run_id)
        if run is not None:
            return run.cancel(reason)
        async with self._reaching("cancel"):
            meta = await self._meta(run_id)
        if meta is None:
            return None
        async with self._reaching("cancel", timed=False):  # the owner's answer bounds it
            return await self._forward_cancel(meta, reason)

    async def _forward_cancel(self, meta: _Meta, reason: str) -> bool | None:
        run_id = meta.run_id
        if meta.status == ENDED:
            return False
        if meta.status == LOST or await self._lost(meta):
            return True  # it is being ended as lost
        answer = await self._ask(meta, {"op": "cancel", "run_id": run_id, "reason": reason})
        if answer is None:
            if await self._lost(meta):
                return True
            raise self._unanswered(meta)
        return bool(answer["cancelled"])

    async def _lost(self, meta: _Meta) -> bool:
        """Whether the run's owner is gone: if so, the run is ended as lost (by anyone)."""
        if await self.redis.exists(self.keys.lease(meta.run_id)):
            return False
        await self.declare_lost(meta.run_id)
        return True

    def _unanswered(self, meta: _Meta) -> OwnerLost:
        return OwnerLost(
            f"replica {meta.replica} executing run {meta.run_id} did not answer within "
            f"{self.reply_timeout_s:g} s; retry",
            run_id=meta.run_id,
        )

    async def _ask(self, meta: _Meta, request: dict[str, Any]) -> dict[str, Any] | None:
        """Send `request` to the run's owner and wait for its answer; None on time-out.

        The request is wanted (a key) until the caller gives up: the owner takes the key
        before applying it, so a request given up on is never applied later.
        """
        reply = self.keys.reply()
        want = f"{reply}:want"
        data = orjson.dumps({**request, "reply": reply, "want": want})
        inbox = self.keys.inbox(meta.replica)
        wait_ms = round(self.reply_timeout_s * 1000)
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(want, "1", px=wait_ms)
        pipe.rpush(inbox, data)
        pipe.pexpire(inbox, 4 * wait_ms)
        await pipe.execute()
        got = await self.redis.blpop([reply], timeout=self.reply_timeout_s)
        if got is None:
            if await self.redis.delete(want):
                return None  # never taken: nothing was done
            got = await self.redis.blpop([reply], timeout=self.reply_timeout_s)  # on its way
            if got is None:
                return None
        answer: dict[str, Any] = orjson.loads(got[1])
        return answer


def _vanished(mirror: Mirror) -> list[Event]:
    """How a follower sees a run end whose stream and meta Redis lost (it restarted empty):
    the open blocks' ends and `run.error` BUS_UNAVAILABLE; the run's log, once it ended on
    the replica that executed it, is in the run log."""
    error = BusUnavailable(
        "the run bus (Redis) lost this run's events; attach again for the run's log",
        operation="follow",
    )
    return _closing_events(mirror.run_id, mirror.events[0].chat_id, mirror.events, error)


def _closing_events(
    run_id: str, chat_id: str, logged: Sequence[Event], error: AgwError
) -> list[Event]:
    """The `*.end`s of the blocks `logged` leaves open (innermost first) and a terminal
    `run.error` of `error`, numbered after the last logged event."""
    open_blocks: dict[str, Event] = {}
    for event in logged:
        name = event.WhichOneof("payload")
        if name in BLOCKS:
            open_blocks[getattr(getattr(event, name), BLOCKS[name][1])] = event
        elif name in BLOCK_ENDS:
            open_blocks.pop(getattr(getattr(event, name), BLOCK_ENDS[name]), None)
    closing = [events.end_of(start) for start in reversed(open_blocks.values())]
    closing.append(events.run_error(error.reason, error.message, error.metadata))
    seq = logged[-1].seq if logged else 0
    now = time.time_ns() // 1_000_000
    for event in closing:
        seq += 1
        event.seq = seq
        event.type = EVENT_TYPES[event.WhichOneof("payload") or ""]
        event.timestamp = now
        event.chat_id = chat_id
        event.run_id = run_id
    return closing
