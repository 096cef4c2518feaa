"""The Redis run bus's key names and Lua scripts, which the parts of `bus.py` call.

Each script runs atomically in Redis; together they keep a run's stream, meta,
lease and chat claim consistent whoever writes them. A run's fence token (in
its meta) guards every write of its owner: the owner appends and renews only
while the fence is the one it registered with, and declaring the owner lost
increments it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from service.core.events import Event

#: A run's status in its meta: executing, its owner declared lost (ending), ended.
RUNNING, LOST, ENDED = "running", "lost", "ended"
#: What APPEND and RENEW answer when the run's meta is gone (Redis lost its data).
GONE = -2


@dataclass(frozen=True, slots=True)
class Keys:
    """The key names, under a prefix (`agw:`)."""

    prefix: str

    def events(self, run_id: str) -> str:
        """The run's stream: entry id `0-<seq>`, field `e` = the serialized `agw.v1.Event`."""
        return f"{self.prefix}run:{run_id}:events"

    def meta(self, run_id: str) -> str:
        """Hash: `chat`, `tenant`, `subject`, `replica` (its owner), `status`, `fence`,
        `agent` (its agent's key), `waits` (its open waits, JSON), `handover` (set while a
        run its draining owner handed over waits to be taken over)."""
        return f"{self.prefix}run:{run_id}:meta"

    def lease(self, run_id: str) -> str:
        """`<replica>:<fence>`, expiring: whoever holds it is alive."""
        return f"{self.prefix}run:{run_id}:lease"

    @property
    def active(self) -> str:
        """Set: the ids of the runs not ended (what the janitors look at)."""
        return f"{self.prefix}runs:active"

    def claim(self, chat_id: str) -> str:
        """The chat's active run id (taken with SET NX)."""
        return f"{self.prefix}chat:{chat_id}:active"

    def settling(self, chat_id: str) -> str:
        """The chat's last ended run id, until that run's records are durable (expiring)."""
        return f"{self.prefix}chat:{chat_id}:settling"

    @property
    def epoch(self) -> str:
        """A random token, set when Redis has none: a new one says Redis lost its data (it
        restarted empty) or is new."""
        return f"{self.prefix}epoch"

    @property
    def reclaiming(self) -> str:
        """Expiring: set with a new epoch, for as long as owners may re-assert their runs'
        claims (a lease); meanwhile nobody else claims a chat that has records."""
        return f"{self.prefix}epoch:reclaiming"

    @property
    def handovers(self) -> str:
        """List: the ids of the runs draining replicas handed over, for any replica to take
        over at once (`HANDOVER`)."""
        return f"{self.prefix}runs:handed-over"

    def alive(self, replica: str) -> str:
        """Expiring: the replica is up."""
        return f"{self.prefix}replica:{replica}:alive"

    def draining(self, replica: str) -> str:
        """Expiring: the replica drains (it stops): it takes no run over."""
        return f"{self.prefix}replica:{replica}:draining"

    @property
    def replicas(self) -> str:
        """Set: the ids of the replicas that opened the bus (those found down are pruned)."""
        return f"{self.prefix}replicas"

    def inbox(self, replica: str) -> str:
        """List: the Submit and Cancel requests for the runs of the replica."""
        return f"{self.prefix}replica:{replica}:inbox"

    def channel(self, run_id: str) -> str:
        """Pub/sub channel: each append of the run's events, as it is made (`APPEND`)."""
        return f"{self.prefix}run:{run_id}:pushed"

    def reply(self) -> str:
        """List: the one answer to one request (a new key each time); `<reply>:want`
        exists while the request may still be applied."""
        return f"{self.prefix}reply:{uuid.uuid4().hex}"

    def claiming(self, run_id: str, chat_id: str) -> list[str]:
        """The first keys of `REGISTER` and `REASSERT`, in order: those of a run's claim."""
        return [self.claim(chat_id), self.meta(run_id), self.lease(run_id), self.active]

    def appending(self, run_id: str, chat_id: str) -> list[str]:
        """The keys of `APPEND`, in order."""
        return [
            self.meta(run_id),
            self.events(run_id),
            self.lease(run_id),
            self.active,
            self.claim(chat_id),
            self.settling(chat_id),
        ]


def _current_epoch(epoch: str, reclaiming: str, token: str, window_ms: str) -> str:
    """Lua setting `local epoch` to Redis's epoch; where it has none (it is new, or lost its
    data), `token` becomes it, and owners have `window_ms` to re-assert their claims."""
    return f"""
local epoch = redis.call('GET', {epoch})
if epoch == false then
  epoch = {token}
  redis.call('SET', {epoch}, epoch)
  redis.call('SET', {reclaiming}, epoch, 'PX', {window_ms})
end
"""


#: Redis's epoch (made now, with its re-assertion window, when it has none).
#: KEYS: epoch, reclaiming; ARGV: a new token, window ms
EPOCH = _current_epoch("KEYS[1]", "KEYS[2]", "ARGV[1]", "ARGV[2]") + "return epoch\n"

#: Registers a run in the replica's epoch (ARGV[8]). Answers {status, value}: {'ok', ''} when
#: it claimed the chat; {'busy', run id} when the chat has an active run; {'epoch', epoch}
#: when Redis's epoch is not the replica's (it must re-assert its own runs first); {'wait',
#: ms left} while owners may re-assert their claims after a new epoch, for a chat that has
#: records (ARGV[10] = '1'): a claim Redis lost may be re-asserted on it.
#: KEYS: claim, meta, lease, active set, epoch, reclaiming; ARGV: run, chat, tenant, subject,
#: replica, lease ms, agent, the replica's epoch, a new token, the chat has records
REGISTER = (
    _current_epoch("KEYS[5]", "KEYS[6]", "ARGV[9]", "ARGV[6]")
    + """
if epoch ~= ARGV[8] then return {'epoch', epoch} end
local active = redis.call('GET', KEYS[1])
if active then return {'busy', active} end
if ARGV[10] == '1' then
  local left = redis.call('PTTL', KEYS[6])
  if left > 0 then return {'wait', tostring(left)} end
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], 'chat', ARGV[2], 'tenant', ARGV[3], 'subject', ARGV[4],
  'replica', ARGV[5], 'status', 'running', 'fence', 1, 'agent', ARGV[7], 'waits', '[]')
redis.call('SET', KEYS[3], ARGV[5] .. ':1', 'PX', ARGV[6])
redis.call('SADD', KEYS[4], ARGV[1])
return {'ok', ''}
"""
)

#: Re-asserts a run of the replica in Redis's epoch ARGV[8] after Redis lost its data: its
#: chat's claim, its meta (status running, its fence, its waits) and its lease, unless Redis
#: has the run. Answers 1 (the run is Redis's again), 0 (another run claimed the chat
#: meanwhile: the replica lost it) or -1 (the epoch changed again: start over).
#: KEYS: claim, meta, lease, active set, epoch; ARGV: run, chat, tenant, subject, replica,
#: lease ms, agent, epoch, fence, waits
REASSERT = """
if redis.call('GET', KEYS[5]) ~= ARGV[8] then return -1 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 1 end
local active = redis.call('GET', KEYS[1])
if active and active ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], 'chat', ARGV[2], 'tenant', ARGV[3], 'subject', ARGV[4],
  'replica', ARGV[5], 'status', 'running', 'fence', ARGV[9], 'agent', ARGV[7],
  'waits', ARGV[10])
redis.call('SET', KEYS[3], ARGV[5] .. ':' .. ARGV[9], 'PX', ARGV[6])
redis.call('SADD', KEYS[4], ARGV[1])
return 1
"""

#: What `APPEND` answers when appending would leave a hole in the stream: the first event
#: given is beyond the one after the stream's last (an earlier append failed), or the stream
#: does not end at the expected seq.
BEHIND = -1

#: The body of `APPEND` and `APPEND_MANY`: a Lua function appending one run's events, its
#: keys `KEYS[k + 1 .. k + 6]` (`Keys.appending`), its arguments `ARGV[a + 1 .. last]`:
#: fence, maxlen, run, expected last seq ('' for any), end ttl ms, settle ms, channel,
#: then seq, data pairs. It answers 1 (appended), 0 (fenced: the fence is not the run's),
#: -2 (GONE: the run's meta is gone, Redis lost its data) or -1 (BEHIND: nothing appended,
#: as the first event given is beyond the one after the stream's last, or the stream does
#: not end at the expected seq). Events already there are skipped (a retried append); those
#: it added are published, in one message, on the run's channel: each one's size (4 bytes,
#: big-endian) then its data (`unpack_pushed`). With an end time-to-live (> 0) the run ends:
#: its status, expiries, lease, active set, and its chat claim, if still the run's, freed
#: and marked settling for the settle time (0: not marked).
_APPEND_ONE = """
local function append(k, a, last)
  local meta, stream = KEYS[k + 1], KEYS[k + 2]
  local fence = redis.call('HGET', meta, 'fence')
  if fence == false then return -2 end
  if fence ~= ARGV[a + 1] then return 0 end
  local top = 0
  local found = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
  if #found > 0 then top = tonumber(string.sub(found[1][1], 3)) end
  if ARGV[a + 4] ~= '' and tonumber(ARGV[a + 4]) ~= top then return -1 end
  if last > a + 7 and tonumber(ARGV[a + 8]) > top + 1 then return -1 end
  local pushed = {}
  local maxlen = ARGV[a + 2]
  for i = a + 8, last, 2 do
    if tonumber(ARGV[i]) > top then
      redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '0-' .. ARGV[i], 'e', ARGV[i + 1])
      pushed[#pushed + 1] = struct.pack('>I4', #ARGV[i + 1]) .. ARGV[i + 1]
    end
  end
  if #pushed > 0 then redis.call('PUBLISH', ARGV[a + 7], table.concat(pushed)) end
  local ttl = tonumber(ARGV[a + 5])
  if ttl > 0 then
    local run = ARGV[a + 3]
    redis.call('HSET', meta, 'status', 'ended')
    redis.call('PEXPIRE', meta, ttl)
    redis.call('PEXPIRE', stream, ttl)
    redis.call('DEL', KEYS[k + 3])
    redis.call('SREM', KEYS[k + 4], run)
    if redis.call('GET', KEYS[k + 5]) == run then
      redis.call('DEL', KEYS[k + 5])
      local settle = tonumber(ARGV[a + 6])
      if settle > 0 then redis.call('SET', KEYS[k + 6], run, 'PX', settle) end
    end
  end
  return 1
end
"""

#: Appends one run's events (see `_APPEND_ONE`).
#: KEYS: `Keys.appending`; ARGV: fence, maxlen, run, expected last seq, end ttl ms, settle ms,
#: channel, seq1, data1, seq2, data2, ...
APPEND = _APPEND_ONE + "return append(0, 0, #ARGV)\n"

#: Appends the events of several runs, in one call (the outbox's, once per loop tick):
#: answers one `APPEND` answer per run, in order. KEYS: each run's `Keys.appending`, in
#: turn; ARGV: the number of runs, then per run the number of its arguments and its
#: arguments as `APPEND`'s.
APPEND_MANY = (
    _APPEND_ONE
    + """
local answers = {}
local at = 2
for r = 1, tonumber(ARGV[1]) do
  local last = at + tonumber(ARGV[at])
  answers[r] = append((r - 1) * 6, at, last)
  at = last + 1
end
return answers
"""
)

#: Renews a lease while the fence holds (1), else 0; -2 when the run's meta is gone (Redis
#: lost its data). KEYS: meta, lease; ARGV: fence, value, ms
RENEW = """
local fence = redis.call('HGET', KEYS[1], 'fence')
if fence == false then return -2 end
if fence ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1
"""

#: Declares a run's owner lost: its lease is gone and the run has not ended. Returns {the new
#: fence (the declarer now holds the lease, so that nobody else declares meanwhile), 1 when
#: the owner handed the run over as it drained (`HANDOVER`), else 0}, else {0, 0}.
#: KEYS: meta, lease, active set; ARGV: run, declaring replica, lease ms
DECLARE = """
if redis.call('EXISTS', KEYS[2]) == 1 then return {0, 0} end
local status = redis.call('HGET', KEYS[1], 'status')
if status == false then
  redis.call('SREM', KEYS[3], ARGV[1])
  return {0, 0}
end
if status ~= 'running' and status ~= 'lost' then return {0, 0} end
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
local handed = redis.call('HDEL', KEYS[1], 'handover')
redis.call('HSET', KEYS[1], 'status', 'lost')
redis.call('SET', KEYS[2], ARGV[2] .. ':' .. fence, 'PX', ARGV[3])
return {fence, handed}
"""

#: Hands a running run over (its owner drains; ARGV[1] its fence): the fence moves on, so that
#: nothing more of the owner is taken (a renewal or an append under way), the lease is let
#: go and the run marked `handover`, and its id is queued on the handovers list for another
#: replica to declare it lost and resume it at once (1; 0 when the run is not the owner's).
#: KEYS: meta, lease, handovers; ARGV: fence, run
HANDOVER = """
if redis.call('HGET', KEYS[1], 'fence') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
redis.call('HINCRBY', KEYS[1], 'fence', 1)
redis.call('HSET', KEYS[1], 'handover', 1)
redis.call('DEL', KEYS[2])
redis.call('RPUSH', KEYS[3], ARGV[2])
return 1
"""

#: Makes replica ARGV[2] the owner of a run it declared lost with the fence ARGV[1], to resume
#: it: status running again, its lease held for ARGV[3] ms (1; 0 when the fence moved on).
#: KEYS: meta, lease
ADOPT = """
if redis.call('HGET', KEYS[1], 'fence') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', 'running', 'replica', ARGV[2])
redis.call('SET', KEYS[2], ARGV[2] .. ':' .. ARGV[1], 'PX', ARGV[3])
return 1
"""

#: The chat's active run as {run, chat, tenant, subject, status, leased}, or nil. It reaches
#: keys it computes (a single server, not Redis Cluster). KEYS: claim; ARGV: key prefix
ACTIVE = """
local run = redis.call('GET', KEYS[1])
if not run then return false end
local meta = redis.call('HMGET', ARGV[1] .. 'run:' .. run .. ':meta',
  'chat', 'tenant', 'subject', 'status')
local leased = redis.call('EXISTS', ARGV[1] .. 'run:' .. run .. ':lease')
return {run, meta[1], meta[2], meta[3], meta[4], leased}
"""

#: Writes a run's open waits (ARGV[1], JSON) into its meta KEYS[1] while it runs under the
#: fence ARGV[2] (1 when written).
SET_WAITS = """
if redis.call('HGET', KEYS[1], 'fence') ~= ARGV[2] then return 0 end
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'waits', ARGV[1])
return 1
"""

#: Deletes KEYS[1] if its value is ARGV[1].
COMPARE_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def unpack_pushed(data: bytes) -> list[Event]:
    """The events of a message `APPEND` published."""
    found: list[Event] = []
    at, end = 0, len(data)
    while at < end:
        size = int.from_bytes(data[at : at + 4])
        at += 4
        found.append(Event.FromString(data[at : at + size]))
        at += size
    return found
