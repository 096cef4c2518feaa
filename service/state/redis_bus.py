"""The Redis-backed `RunBus`: any replica follows, answers and cancels any run.

The replica that executes a run (its *owner*) keeps it in memory as the
in-process bus does, and publishes every event of it to Redis; every other
replica reads the run from there. The keys, under a prefix (`agw:`):

| key | type | what |
|---|---|---|
| `run:{id}:events` | stream | the run's events: id `0-<seq>`, field `e` = the `agw.v1.Event` |
| `run:{id}:meta` | hash | `chat`, `tenant`, `subject`, `replica` (the owner), `status`, `fence` |
| `run:{id}:lease` | string | `<replica>:<fence>`, expiring: the owner is alive |
| `runs:active` | set | the ids of the runs not ended (what the janitors look at) |
| `chat:{id}:active` | string | the chat's active run (taken with SET NX) |
| `chat:{id}:settling` | string | the chat's last ended run, until its records are durable |
| `replica:{id}:alive` | string | expiring: the replica is up |
| `replica:{id}:inbox` | list | Submit and Cancel requests for the runs of that replica |
| `reply:{uuid}` | list | the one answer to one request |

Status goes `running` → `ended` (the terminal event is appended), or
`running` → `lost` → `ended` when the owner was lost.

*Events.* One publisher task per run drains the run's appended events (it
observes the run's `EventLog`, so the run and its local followers never wait
for Redis) and appends them in order, a batch per round trip, with a Lua
script that first checks the run's fence token. The terminal event's batch also
marks the run ended, frees the chat (marking it settling) and gives the stream
and the meta their expiry. A follower elsewhere reads the stream from
`after_seq` with `XRANGE`, then waits with `XREAD BLOCK`, to the terminal event.

*Owner failure.* The owner renews each live run's lease every third of its
time to live. A follower that sees no progress for a while, a query meeting the
chat's active run, a Submit or Cancel, and each replica's janitor (every
lease period, over `runs:active`) check the lease; when it has expired, one of
them declares the owner lost atomically (the lease is gone and the run not
ended: the fence is incremented, the status is `lost`, the declarer holds the
lease), replays the stream to find the blocks still open, and appends their
`*.end`s and a terminal `run.error` with reason `OWNER_LOST` — with the new
fence, and only if the stream still ends where it read it. A declarer that dies
in between lets its lease expire, and the next one does it again. The old
owner, if it comes back, has its appends and renewals refused by the fence: it
cancels its run (reason "fenced") and writes nothing more of it.

*Submit and Cancel* for a run of another replica go to that replica's inbox
with a reply key; the owner applies them as the in-process bus would and pushes
the answer. An owner that does not answer within the reply time-out: when its
lease has expired, the run is ended as lost (Submit answers `EXPIRED`, Cancel
True); otherwise the call is refused with `OWNER_LOST` (UNAVAILABLE: retry).

A single Redis server (or primary) is assumed, not Redis Cluster: scripts
reach keys they compute.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError
from redis.typing import KeyT, StreamIdT

from service.core import events
from service.core.commands import Principal, SubmitCommand, SubmitResult
from service.core.errors import STATUS_OF, AgwError, Conflict, OwnerLost
from service.core.eventlog import Emitter
from service.core.events import BLOCK_ENDS, BLOCKS, EVENT_TYPES, TERMINALS, Event
from service.core.ids import valid_run_id
from service.core.ports import RunRef
from service.core.runstate import RunState
from service.core.waits import Waits

log = logging.getLogger("agw.bus")

RUNNING, LOST, ENDED = "running", "lost", "ended"
MAX_BATCH = 256  # events appended per round trip
READ_COUNT = 512  # events read per round trip
SETTLE_MARK_S = 30.0  # a settling mark outlives an owner that died before settling
SETTLE_WAIT_S = 10.0  # a new run waits at most this long for the chat's last run to settle

# Registers a run: claims its chat, or returns the chat's active run id.
# KEYS: claim, meta, lease, active set; ARGV: run, chat, tenant, subject, replica, lease ms
REGISTER = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX') == false then
  return redis.call('GET', KEYS[1])
end
redis.call('HSET', KEYS[2], 'chat', ARGV[2], 'tenant', ARGV[3], 'subject', ARGV[4],
  'replica', ARGV[5], 'status', 'running', 'fence', 1)
redis.call('SET', KEYS[3], ARGV[5] .. ':1', 'PX', ARGV[6])
redis.call('SADD', KEYS[4], ARGV[1])
return ''
"""

# Appends events (seq, bytes pairs) if the fence holds (0 otherwise), skipping those
# already there; -1 when the stream does not end at the expected seq (ARGV[4], '' for
# any). With an end time-to-live (ARGV[5] > 0) the run ends: status, expiries, lease,
# active set, and the chat claim (if still the run's) freed and marked settling (ARGV[6] ms).
# KEYS: meta, events, lease, active set, claim, settling
# ARGV: fence, maxlen, run, expected last seq, end ttl ms, settle ms, seq1, data1, ...
APPEND = """
if redis.call('HGET', KEYS[1], 'fence') ~= ARGV[1] then return 0 end
local top = 0
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
if #last > 0 then top = tonumber(string.sub(last[1][1], 3)) end
if ARGV[4] ~= '' and tonumber(ARGV[4]) ~= top then return -1 end
for i = 7, #ARGV, 2 do
  if tonumber(ARGV[i]) > top then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '0-' .. ARGV[i], 'e', ARGV[i + 1])
  end
end
local ttl = tonumber(ARGV[5])
if ttl > 0 then
  redis.call('HSET', KEYS[1], 'status', 'ended')
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
  redis.call('DEL', KEYS[3])
  redis.call('SREM', KEYS[4], ARGV[3])
  if redis.call('GET', KEYS[5]) == ARGV[3] then
    redis.call('DEL', KEYS[5])
    if tonumber(ARGV[6]) > 0 then redis.call('SET', KEYS[6], ARGV[3], 'PX', ARGV[6]) end
  end
end
return 1
"""

# Renews a lease while the fence holds (1), else 0. KEYS: meta, lease; ARGV: fence, value, ms
RENEW = """
if redis.call('HGET', KEYS[1], 'fence') ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1
"""

# Declares the owner of a run lost: its lease is gone and it has not ended. Returns the
# new fence (the declarer now holds the lease), or 0. KEYS: meta, lease, active set;
# ARGV: run, declaring replica, lease ms
DECLARE = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local status = redis.call('HGET', KEYS[1], 'status')
if status == false then
  redis.call('SREM', KEYS[3], ARGV[1])
  return 0
end
if status ~= 'running' and status ~= 'lost' then return 0 end
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
redis.call('HSET', KEYS[1], 'status', 'lost')
redis.call('SET', KEYS[2], ARGV[2] .. ':' .. fence, 'PX', ARGV[3])
return fence
"""

# The chat's active run: {run, chat, tenant, subject, status, leased}, or nil.
# KEYS: claim; ARGV: key prefix
ACTIVE = """
local run = redis.call('GET', KEYS[1])
if not run then return false end
local meta = redis.call('HMGET', ARGV[1] .. 'run:' .. run .. ':meta',
  'chat', 'tenant', 'subject', 'status')
local leased = redis.call('EXISTS', ARGV[1] .. 'run:' .. run .. ':lease')
return {run, meta[1], meta[2], meta[3], meta[4], leased}
"""

# Deletes KEYS[1] if its value is ARGV[1].
COMPARE_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def default_replica_id() -> str:
    """hostname-pid-random: unique per process, readable in logs."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def ref(run: RunState) -> RunRef:
    return RunRef(run.run_id, run.chat_id, run.owner, running=not run.done)


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


def _events_of(entries: Any) -> list[Event]:
    """The events of stream entries (`[(id, {b"e": data})]`)."""
    return [Event.FromString(fields[b"e"]) for _entry_id, fields in entries]


def _is_terminal(event: Event) -> bool:
    return event.WhichOneof("payload") in TERMINALS


@dataclass(slots=True)
class _Owned:
    """A run this replica executes: its fence token and its publisher."""

    run: RunState
    fence: int
    publisher: _Publisher | None = None
    fenced: bool = False

    @property
    def live(self) -> bool:
        """Whether its lease is still to be renewed."""
        return not self.fenced and not (self.publisher is not None and self.publisher.finished)


@dataclass(slots=True)
class _Meta:
    """A run as its meta hash describes it."""

    run_id: str
    chat_id: str
    owner: Principal
    replica: str
    status: str
    fence: int = 0

    @property
    def ref(self) -> RunRef:
        return RunRef(self.run_id, self.chat_id, self.owner, running=self.status != ENDED)


class _Publisher:
    """Appends one run's events to its stream, in order, a batch per round trip."""

    def __init__(self, bus: RedisRunBus, owned: _Owned) -> None:
        self._bus = bus
        self._owned = owned
        self._pending: list[Event] = []
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self.finished = False  # the terminal event is appended, or the run was fenced
        self.task = asyncio.create_task(self._run(), name=f"publish-{owned.run.run_id}")

    def push(self, event: Event) -> None:
        """Queue an appended event (the run's log calls this, synchronously, in order)."""
        if self.finished:
            return
        self._pending.append(event)
        self._drained.clear()
        self._wake.set()

    async def drained(self, timeout_s: float) -> bool:
        """Wait until what was pushed so far is appended; False on time-out."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._drained.wait()
        except TimeoutError:
            return False
        return True

    async def _run(self) -> None:
        backoff = 0.05
        try:
            while not self.finished:
                await self._wake.wait()
                self._wake.clear()
                while self._pending and not self.finished:
                    await self._bus.writable()
                    batch = self._pending[:MAX_BATCH]
                    try:
                        appended = await self._bus.append_events(self._owned, batch)
                    except (RedisError, OSError) as error:
                        log.warning("run %s: cannot publish (%s)", self._owned.run.run_id, error)
                        await asyncio.sleep(backoff)
                        backoff = min(backoff * 2, 2.0)
                        continue
                    backoff = 0.05
                    del self._pending[: len(batch)]
                    if not appended:
                        self.finished = True
                        self._bus.fence(self._owned)
                    elif _is_terminal(batch[-1]):
                        self.finished = True
                if not self._pending:
                    self._drained.set()
        finally:
            self._drained.set()


@dataclass(slots=True)
class _Keys:
    """The key names, under a prefix."""

    prefix: str

    def events(self, run_id: str) -> str:
        return f"{self.prefix}run:{run_id}:events"

    def meta(self, run_id: str) -> str:
        return f"{self.prefix}run:{run_id}:meta"

    def lease(self, run_id: str) -> str:
        return f"{self.prefix}run:{run_id}:lease"

    @property
    def active(self) -> str:
        return f"{self.prefix}runs:active"

    def claim(self, chat_id: str) -> str:
        return f"{self.prefix}chat:{chat_id}:active"

    def settling(self, chat_id: str) -> str:
        return f"{self.prefix}chat:{chat_id}:settling"

    def alive(self, replica: str) -> str:
        return f"{self.prefix}replica:{replica}:alive"

    def inbox(self, replica: str) -> str:
        return f"{self.prefix}replica:{replica}:inbox"

    def reply(self) -> str:
        return f"{self.prefix}reply:{uuid.uuid4().hex}"


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
        self.keys = _Keys(prefix)
        self.redis = aioredis.Redis.from_url(url, protocol=2)  # connects on first use
        self._register = self.redis.register_script(REGISTER)
        self._append = self.redis.register_script(APPEND)
        self._renew = self.redis.register_script(RENEW)
        self._declare = self.redis.register_script(DECLARE)
        self._active = self.redis.register_script(ACTIVE)
        self._compare_delete = self.redis.register_script(COMPARE_DELETE)
        self._runs: dict[str, _Owned] = {}
        self._freed: dict[str, asyncio.Event] = {}  # run id -> set once the run ended
        self._loops: list[asyncio.Task[None]] = []
        self._resumed = asyncio.Event()
        self._resumed.set()

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def wait_timeout_s(self) -> float:
        return self.waits.timeout_s

    async def open(self) -> None:
        await self.redis.set(self.keys.alive(self.replica_id), "1", px=self._lease_ms)
        self._loops = [
            asyncio.create_task(self._renew_leases(), name=f"leases-{self.replica_id}"),
            asyncio.create_task(self._serve_inbox(), name=f"inbox-{self.replica_id}"),
            asyncio.create_task(self._janitor(), name=f"janitor-{self.replica_id}"),
        ]
        log.info("run bus on Redis as replica %s", self.replica_id)

    async def close(self) -> None:
        tasks = self._loops + [
            o.publisher.task for o in self._runs.values() if o.publisher is not None
        ]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loops = []
        try:
            await self.redis.delete(self.keys.alive(self.replica_id))
        except (RedisError, OSError) as error:
            log.warning("replica %s: could not sign off (%s)", self.replica_id, error)
        await self.redis.aclose()

    def suspend(self) -> None:
        """Stop writing to Redis — lease renewals and event appends — as a frozen or cut-off
        process would, until `resume`; the runs go on in this process (failure drills)."""
        self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()

    async def writable(self) -> None:
        """Return once this replica may write (at once unless suspended)."""
        await self._resumed.wait()

    @property
    def _lease_ms(self) -> int:
        return max(1, round(self.lease_ttl_s * 1000))

    # -- the owner's side --------------------------------------------------------------

    async def register(self, run: RunState) -> RunRef | None:
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
                    ],
                )
            )
            if not clash:
                owned = _Owned(run, fence=1)
                owned.publisher = _Publisher(self, owned)
                run.log.observe(owned.publisher.push)
                self._runs[run.run_id] = owned
                self._freed[run.run_id] = asyncio.Event()
                return None
            active = await self.active_of(run.chat_id)
            if active is not None:
                return active
        raise Conflict(f"chat {run.chat_id!r} changed hands too often; retry", chat_id=run.chat_id)

    async def append_events(self, owned: _Owned, batch: Sequence[Event]) -> bool:
        """Append `batch` to the run's stream under its fence; False when fenced out."""
        run = owned.run
        terminal = bool(batch) and _is_terminal(batch[-1])
        args: list[Any] = [
            owned.fence,
            self.stream_maxlen,
            run.run_id,
            "",
            round(self.stream_ttl_s * 1000) if terminal else 0,
            round(SETTLE_MARK_S * 1000),
        ]
        for event in batch:
            args += [event.seq, event.SerializeToString()]
        appended = await self._append(keys=self._append_keys(run.run_id, run.chat_id), args=args)
        return int(appended) == 1

    def _append_keys(self, run_id: str, chat_id: str) -> list[str]:
        keys = self.keys
        return [
            keys.meta(run_id),
            keys.events(run_id),
            keys.lease(run_id),
            keys.active,
            keys.claim(chat_id),
            keys.settling(chat_id),
        ]

    def fence(self, owned: _Owned) -> None:
        """Another replica declared this one lost for the run: stop it here, write nothing."""
        if owned.fenced:
            return
        owned.fenced = True
        owned.run.fenced = True
        log.warning(
            "run %s was taken over by another replica (this one was declared lost); "
            "cancelling it here",
            owned.run.run_id,
        )
        owned.run.cancel("fenced")
        freed = self._freed.pop(owned.run.run_id, None)
        if freed is not None:
            freed.set()

    async def ended(self, run: RunState) -> None:
        owned = self._runs.get(run.run_id)
        if owned is not None and not owned.fenced and owned.publisher is not None:
            await owned.publisher.drained(self.reply_timeout_s)
            if not owned.publisher.finished and not owned.fenced:  # no terminal event went out
                ttl = round(self.stream_ttl_s * 1000)
                await self._append(
                    keys=self._append_keys(run.run_id, run.chat_id),
                    args=[owned.fence, self.stream_maxlen, run.run_id, "", ttl, 0],
                )
                owned.publisher.finished = True
        freed = self._freed.pop(run.run_id, None)
        if freed is not None:
            freed.set()

    async def settled(self, run: RunState) -> None:
        owned = self._runs.get(run.run_id)
        if owned is not None and owned.fenced:
            return
        await self._compare_delete(keys=[self.keys.settling(run.chat_id)], args=[run.run_id])

    async def release(self, run_id: str) -> None:
        freed = self._freed.pop(run_id, None)
        if freed is not None:
            freed.set()
        owned = self._runs.pop(run_id, None)
        if owned is not None and owned.publisher is not None and not owned.publisher.task.done():
            owned.publisher.task.cancel()
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
        """Renew the leases of the live runs, and this replica's liveness, every ttl/3."""
        while True:
            await asyncio.sleep(self.lease_ttl_s / 3)
            await self.writable()
            owned = [o for o in self._runs.values() if o.live]
            try:
                pipe = self.redis.pipeline(transaction=False)
                pipe.set(self.keys.alive(self.replica_id), "1", px=self._lease_ms)
                for o in owned:
                    run_id = o.run.run_id
                    await self._renew(
                        keys=[self.keys.meta(run_id), self.keys.lease(run_id)],
                        args=[o.fence, f"{self.replica_id}:{o.fence}", self._lease_ms],
                        client=pipe,
                    )
                results = await pipe.execute()
            except (RedisError, OSError) as error:
                log.warning("cannot renew the leases of %d runs (%s)", len(owned), error)
                continue
            for o, renewed in zip(owned, results[1:], strict=True):
                if not int(renewed):
                    self.fence(o)

    async def _serve_inbox(self) -> None:
        """Apply the Submits and Cancels other replicas send for the runs of this one."""
        inbox = self.keys.inbox(self.replica_id)
        while True:
            try:
                item = await self.redis.blpop([inbox], timeout=0)
                if item is None:
                    continue
                request = orjson.loads(item[1])
                answer = self._answer(request)
                pipe = self.redis.pipeline(transaction=False)
                pipe.rpush(request["reply"], orjson.dumps(answer))
                pipe.pexpire(request["reply"], round(self.reply_timeout_s * 2000))
                await pipe.execute()
            except (RedisError, OSError) as error:
                log.warning("inbox of replica %s: %s", self.replica_id, error)
                await asyncio.sleep(0.5)
            except (ValueError, KeyError, TypeError) as error:
                log.warning("inbox of replica %s: malformed request (%s)", self.replica_id, error)

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
        run = self._here(command.run_id) if command.run_id else None
        if run is not None and command.chat_id and command.chat_id != run.chat_id:
            run = None  # not a run of that chat
        if run is not None and run.owner != command.principal:
            run = None  # not a run of this caller's
        return self.waits.submit(command, run_known=run is not None)

    async def wait(
        self, out: Emitter, tool_id: str, tool_name: str, timeout_s: float | None = None
    ) -> Any:
        return await self.waits.wait(out, tool_id, tool_name, timeout_s)

    def waiting(self, run_id: str) -> list[str]:
        return self.waits.waiting(run_id)

    # -- anyone's side -----------------------------------------------------------------

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
            int(fields.get("fence") or 0),
        )

    async def find(self, run_id: str) -> RunRef | None:
        run = self._here(run_id)
        if run is not None:
            return ref(run)
        meta = await self._meta(run_id)
        return meta.ref if meta is not None else None

    async def active_of(self, chat_id: str) -> RunRef | None:
        for _ in range(5):
            found = await self._active(keys=[self.keys.claim(chat_id)], args=[self.keys.prefix])
            if not found:
                return None
            run_id, chat, tenant, subject, status, leased = (
                _text(found[0]),
                _text(found[1]),
                _text(found[2]),
                _text(found[3]),
                _text(found[4]),
                int(found[5]),
            )
            run = self._here(run_id)
            if run is not None:
                return ref(run)
            if not status:  # the claim outlived its run's meta: drop it
                await self._compare_delete(keys=[self.keys.claim(chat_id)], args=[run_id])
                continue
            if status != ENDED and not leased and await self.declare_lost(run_id):
                continue  # its owner was lost: the run is ended and the chat freed
            return RunRef(run_id, chat, Principal(tenant, subject), running=status != ENDED)
        return None

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
        while await self.redis.exists(self.keys.settling(chat_id)):
            if time.monotonic() >= deadline:
                log.warning("chat %s: its last run did not settle in %gs", chat_id, SETTLE_WAIT_S)
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    async def follow(self, run_id: str, after_seq: int) -> AsyncGenerator[Event, None] | None:
        run = self._here(run_id)
        if run is not None:
            return run.follow(after_seq)
        if await self._meta(run_id) is None:
            return None
        return self._follow_stream(run_id, after_seq)

    async def _follow_stream(self, run_id: str, after_seq: int) -> AsyncGenerator[Event, None]:
        """The run's stream after `after_seq` to its terminal event; the owner is watched."""
        stream = self.keys.events(run_id)
        last = max(after_seq, 0)
        block_ms = max(1, round(self.lease_ttl_s * 250))  # a quarter of the lease
        catch_up = True
        while True:
            if catch_up:  # read what is there, and the run's state, at one instant
                pipe = self.redis.pipeline(transaction=True)
                pipe.xrange(stream, min=f"(0-{last}", max="+", count=READ_COUNT)
                pipe.hget(self.keys.meta(run_id), "status")
                pipe.exists(self.keys.lease(run_id))
                entries, status, leased = await pipe.execute()
                if not entries:
                    if status is None or _text(status) == ENDED:
                        return  # nothing after `last`, and nothing more will come
                    if not leased:
                        await self.declare_lost(run_id)
                        continue
                    catch_up = False
            else:
                position: dict[KeyT, StreamIdT] = {stream: f"0-{last}"}
                reply: Any = await self.redis.xread(position, count=READ_COUNT, block=block_ms)
                if not reply:
                    catch_up = True  # no progress for a while: look at the owner
                    continue
                entries = reply[0][1]
            for event in _events_of(entries):
                last = event.seq
                yield event
                if _is_terminal(event):
                    return

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
        closing = _closing_events(meta, logged)
        top = logged[-1].seq if logged else 0
        args: list[Any] = [fence, self.stream_maxlen, run_id, top, round(self.lost_ttl_s * 1000), 0]
        for event in closing:
            args += [event.seq, event.SerializeToString()]
        appended = int(await self._append(keys=self._append_keys(run_id, meta.chat_id), args=args))
        if appended == 1:
            log.warning(
                "run %s: replica %s was lost (its lease expired); ended the run as OWNER_LOST",
                run_id,
                meta.replica,
            )
        return appended == 1

    async def _janitor(self) -> None:
        """End the runs whose owner was lost, also those nobody follows, every lease period."""
        while True:
            await asyncio.sleep(self.lease_ttl_s * (0.75 + secrets.randbelow(500) / 1000))
            try:
                members = await self.redis.smembers(self.keys.active)
                others = [_text(m) for m in members if _text(m) not in self._runs]
                if not others:
                    continue
                pipe = self.redis.pipeline(transaction=False)
                for run_id in others:
                    pipe.exists(self.keys.lease(run_id))
                leased = await pipe.execute()
                for run_id, alive in zip(others, leased, strict=True):
                    if not alive:
                        await self.declare_lost(run_id)
            except (RedisError, OSError) as error:
                log.warning("janitor of replica %s: %s", self.replica_id, error)

    # -- Submit and Cancel from anywhere -----------------------------------------------

    async def submit(self, command: SubmitCommand) -> SubmitResult:
        if not command.run_id or self._here(command.run_id) is not None:
            return self._submit_here(command)
        self.waits.check(command)
        meta = await self._meta(command.run_id)
        if (
            meta is None
            or (command.chat_id and command.chat_id != meta.chat_id)
            or meta.owner != command.principal
        ):
            return self.waits.submit(command, run_known=False)
        if meta.status == LOST or (meta.status == RUNNING and await self._lost(meta)):
            return SubmitResult("EXPIRED", f"tool {command.tool_id!r} stopped waiting ({GONE})")
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
                return SubmitResult("EXPIRED", f"tool {command.tool_id!r} stopped waiting ({GONE})")
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
        meta = await self._meta(run_id)
        if meta is None:
            return None
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
        """Send `request` to the run's owner and wait for its answer; None on time-out."""
        reply = self.keys.reply()
        data = orjson.dumps({**request, "reply": reply}).decode()
        inbox = self.keys.inbox(meta.replica)
        pipe = self.redis.pipeline(transaction=True)
        pipe.rpush(inbox, data)
        pipe.pexpire(inbox, round(self.reply_timeout_s * 4000))
        await pipe.execute()
        got = await self.redis.blpop([reply], timeout=self.reply_timeout_s)
        if got is None:
            if await self.redis.lrem(inbox, 1, data):
                log.warning("replica %s did not take a request in time", meta.replica)
            return None
        answer: dict[str, Any] = orjson.loads(got[1])
        return answer


#: Why a lost run's tools stopped waiting.
GONE = "the run ended: the replica executing it was lost"


def _closing_events(meta: _Meta, logged: Sequence[Event]) -> list[Event]:
    """The `*.end`s of the blocks `logged` leaves open (innermost first) and a terminal
    `run.error` OWNER_LOST, numbered after the last logged event."""
    open_blocks: dict[str, Event] = {}
    for event in logged:
        name = event.WhichOneof("payload")
        if name in BLOCKS:
            open_blocks[getattr(getattr(event, name), BLOCKS[name][1])] = event
        elif name in BLOCK_ENDS:
            open_blocks.pop(getattr(getattr(event, name), BLOCK_ENDS[name]), None)
    error = OwnerLost(
        f"replica {meta.replica} executing the run was lost (its lease expired)",
        replica=meta.replica,
    )
    closing = [events.end_of(start) for start in reversed(open_blocks.values())]
    closing.append(events.run_error(error.reason, error.message, error.metadata))
    seq = logged[-1].seq if logged else 0
    now = time.time_ns() // 1_000_000
    for event in closing:
        seq += 1
        event.seq = seq
        event.type = EVENT_TYPES[event.WhichOneof("payload") or ""]
        event.timestamp = now
        event.chat_id = meta.chat_id
        event.run_id = meta.run_id
    return closing
