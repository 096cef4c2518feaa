"""The mailbox: Submit and Cancel delivered to the replica that executes the run.

A Submit or a Cancel for a run of this replica is applied here, as the in-process
bus would. One for a run of another replica goes to that replica's inbox with a
reply key, and a key saying the request is still wanted; the owner takes that key,
applies the request as the in-process bus would (the same checks: principal, chat
id), and pushes the answer. When the owner does not answer within the reply
time-out, the caller takes the key back (a request given up on is never applied
later): if the owner's lease has expired the run is ended as lost (Submit answers
`EXPIRED`, Cancel True); otherwise the call is refused with `OWNER_LOST`
(UNAVAILABLE: nothing was done; retry).
"""

from __future__ import annotations

from typing import Any

import orjson

from service.core.commands import SubmitCommand, SubmitResult
from service.core.errors import STATUS_OF, AgwError, OwnerLost
from service.core.ids import Principal
from service.core.run.waits import Waits
from service.state.redis.leases import Leases
from service.state.redis.link import INBOX_POLL_S, Link
from service.state.redis.meta import Meta, read_meta
from service.state.redis.owned import OwnedRuns
from service.state.redis.scripts import ENDED, LOST, RUNNING

#: Why a lost run's tools stopped waiting.
GONE = "the run ended: the replica executing it was lost"

#: The errors an owner may answer a forwarded Submit with, by reason.
_ERRORS: dict[str, type[AgwError]] = {
    cls.reason: cls for cls in STATUS_OF if cls.__init__ is AgwError.__init__
}


class Mailbox:
    """Submit and Cancel from anywhere, and this replica's inbox."""

    def __init__(self, link: Link, runs: OwnedRuns, waits: Waits, leases: Leases) -> None:
        self._link = link
        self._runs = runs
        self._waits = waits
        self._leases = leases

    # -- the caller's side -------------------------------------------------------------

    async def submit(self, command: SubmitCommand) -> SubmitResult:
        if not command.run_id or self._runs.here(command.run_id) is not None:
            return self._submit_here(command)
        self._waits.check(command)
        async with self._link.reaching("submit"):
            meta = await read_meta(self._link, command.run_id)
        async with self._link.reaching("submit", timed=False):  # the owner's answer bounds it
            return await self._forward_submit(command, meta)

    async def _forward_submit(self, command: SubmitCommand, meta: Meta | None) -> SubmitResult:
        if (
            meta is None
            or (command.chat_id and command.chat_id != meta.chat_id)
            or meta.owner != command.principal
        ):
            return self._waits.submit(command, run_known=False)
        gone = SubmitResult("EXPIRED", f"tool {command.tool_id!r} stopped waiting ({GONE})")
        if meta.status == LOST or (meta.status == RUNNING and await self._leases.lost(meta.run_id)):
            return gone
        alive = self._link.keys.alive(meta.replica)
        if not await self._link.redis.exists(alive):  # ended, owner gone
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
            if await self._leases.lost(meta.run_id):
                return gone
            raise self._unanswered(meta)
        if "error" in answer:
            error = answer["error"]
            cls = _ERRORS.get(error["reason"], AgwError)
            raise cls(error["message"], **error.get("metadata", {}))
        return SubmitResult(answer["outcome"], answer["detail"])

    async def cancel(self, run_id: str, reason: str) -> bool | None:
        run = self._runs.here(run_id)
        if run is not None:
            return run.cancel(reason)
        async with self._link.reaching("cancel"):
            meta = await read_meta(self._link, run_id)
        if meta is None:
            return None
        async with self._link.reaching("cancel", timed=False):  # the owner's answer bounds it
            return await self._forward_cancel(meta, reason)

    async def _forward_cancel(self, meta: Meta, reason: str) -> bool | None:
        run_id = meta.run_id
        if meta.status == ENDED:
            return False
        if meta.status == LOST or await self._leases.lost(run_id):
            return True  # it is being ended as lost
        answer = await self._ask(meta, {"op": "cancel", "run_id": run_id, "reason": reason})
        if answer is None:
            if await self._leases.lost(run_id):
                return True
            raise self._unanswered(meta)
        return bool(answer["cancelled"])

    def _unanswered(self, meta: Meta) -> OwnerLost:
        return OwnerLost(
            f"replica {meta.replica} executing run {meta.run_id} did not answer within "
            f"{self._link.reply_timeout_s:g} s; retry",
            run_id=meta.run_id,
        )

    async def _ask(self, meta: Meta, request: dict[str, Any]) -> dict[str, Any] | None:
        """Send `request` to the run's owner and wait for its answer; None on time-out.

        The request is wanted (a key) until the caller gives up: the owner takes the key
        before applying it, so a request given up on is never applied later.
        """
        link = self._link
        reply = link.keys.reply()
        want = f"{reply}:want"
        data = orjson.dumps({**request, "reply": reply, "want": want})
        inbox = link.keys.inbox(meta.replica)
        wait_ms = round(link.reply_timeout_s * 1000)
        pipe = link.redis.pipeline(transaction=True)
        pipe.set(want, "1", px=wait_ms)
        pipe.rpush(inbox, data)
        pipe.pexpire(inbox, 4 * wait_ms)
        await pipe.execute()
        got = await link.redis.blpop([reply], timeout=link.reply_timeout_s)
        if got is None:
            if await link.redis.delete(want):
                return None  # never taken: nothing was done
            got = await link.redis.blpop([reply], timeout=link.reply_timeout_s)  # on its way
            if got is None:
                return None
        answer: dict[str, Any] = orjson.loads(got[1])
        return answer

    # -- the owner's side --------------------------------------------------------------

    async def serve(self) -> None:
        """Apply a Submit or Cancel another replica sent for a run of this one, if any."""
        link = self._link
        item = await link.redis.blpop([link.keys.inbox(link.replica_id)], timeout=INBOX_POLL_S)
        if item is None:
            return
        request = orjson.loads(item[1])
        if not await link.redis.delete(request["want"]):
            return  # its caller gave up on it
        answer = self._answer(request)
        pipe = link.redis.pipeline(transaction=False)
        pipe.rpush(request["reply"], orjson.dumps(answer))
        pipe.pexpire(request["reply"], round(link.reply_timeout_s * 2000))
        await pipe.execute()

    def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """What this replica answers a forwarded request with."""
        if request["op"] == "cancel":
            run = self._runs.here(request["run_id"])
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
        here = self._runs.here(command.run_id) if command.run_id else None
        return self._waits.deliver(command, here)
