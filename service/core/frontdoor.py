"""The core's front door: starts runs, finds them, answers and cancels them, shows chats.

The transports decode their requests into core commands and call this and
nothing else; this talks to the state ports (`ChatStore`, `RunLog`, `RunBus`)
and never to a concrete store. Failures before a run exists are raised as
`AgwError`s (the transport turns them into statuses); once `query` returns,
every outcome is an event of the run.

A query resolves its agent, binds each stage's model and checks its tools and
subagents once, here; the run's lifecycle (claiming the chat, launching,
keeping, releasing, draining: lifecycle.py) does the rest. A run outlives the
client that started it (by default): it can be re-joined with `attach` while
it runs, for `retention_s` after it ended from memory, then from the run log.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import datetime
import logging
import re
import secrets
import time
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from service.core import events
from service.core.agents.catalog import AgentCatalog
from service.core.agents.definition import AgentDefinition
from service.core.agents.overrides import with_overrides
from service.core.agents.registry import AgentRegistry
from service.core.agents.skills import SkillRegistry
from service.core.agents.store import AgentStore
from service.core.chats.history import replay
from service.core.chats.upkeep import ChatCleaner, ChatUpkeep, Deleted
from service.core.chats.uploads import Uploads
from service.core.commands import ChatView, QueryCommand, SubmitCommand, SubmitResult, UploadCommand
from service.core.errors import (
    BusUnavailable,
    ChatNotFound,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    RunNotFound,
)
from service.core.files import FileContent, WorkspaceFile, WorkspaceFiles
from service.core.ids import (
    ADMIN,
    ANONYMOUS,
    Principal,
    check_chat_id,
    shorten,
    valid_run_id,
)
from service.core.lifecycle import RunLifecycle, RunOptions
from service.core.model import ModelRouter
from service.core.modes import MODES
from service.core.ports import ChatStore, RunBus, RunJournal, RunLog
from service.core.quotas import Quotas
from service.core.run.binding import bind_stages
from service.core.run.context import RunServices
from service.core.run.prompt import PromptValues, render
from service.core.run.state import RunState
from service.core.run.subagents import Subagents
from service.core.tools.definitions import client_tools
from service.core.tools.names import SERVICE_TOOLS
from service.core.tools.registry import ToolRegistry
from service.core.values import ChatSummary, LiveRun, SpendEntry, StoredUpload
from service.core.webhooks import (
    MAX_WEBHOOKS,
    Webhook,
    WebhookOptions,
    WebhookStore,
    webhook_of,
)

log = logging.getLogger("agw.runtime")

DEFAULT_PAGE_SIZE = 50
DOWNLOAD_CHUNK_BYTES = 64 * 1024  # a DownloadFile message's bytes at most
MIN_WAIT_S = 0.05  # a Wait of 0 still reads what the run has done so far
_WEBHOOK_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def valid_webhook_id(webhook_id: str) -> bool:
    return _WEBHOOK_ID.fullmatch(webhook_id) is not None


MAX_PAGE_SIZE = 500
MAX_NAME_FILTER = 200
MAX_SPEND_DAYS = 366
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}\Z")


def _day(text: str, name: str) -> datetime.date:
    try:
        if _DAY.match(text):
            return datetime.date.fromisoformat(text)
    except ValueError:
        pass
    raise InvalidRequest(f"{name} must be a day as YYYY-MM-DD, not {shorten(text)!r}")


class FrontDoor:
    """Starts and tracks the runs of the loaded agents."""

    def __init__(
        self,
        agents: AgentRegistry,
        models: ModelRouter,
        *,
        chats: ChatStore,
        run_log: RunLog,
        bus: RunBus,
        uploads: Uploads,
        tools: ToolRegistry | None = None,
        skills: SkillRegistry | None = None,
        options: RunOptions | None = None,
        journal: RunJournal | None = None,
        chat_cleaners: Sequence[ChatCleaner] = (),
        quotas: Quotas | None = None,
        agent_store: AgentStore | None = None,
        agent_store_poll_s: float = 5.0,
        files: WorkspaceFiles | None = None,
        download_max_bytes: int = 64 * 1024 * 1024,
        webhooks: WebhookStore | None = None,
        webhook_options: WebhookOptions | None = None,
    ) -> None:
        options = options if options is not None else RunOptions()
        self.quotas = quotas
        if quotas is not None:  # it sees every run's model calls, as a middleware
            options = dataclasses.replace(options, middlewares=(*options.middlewares, quotas))
        self.agents = agents
        # agents created, updated and rolled back through calls, served in the registry
        self.catalog = AgentCatalog(agents, agent_store, poll_s=agent_store_poll_s)
        self.files = files  # the chats' workspaces, for ListFiles and DownloadFile
        self.download_max_bytes = download_max_bytes
        self.webhooks = webhooks  # the runs' webhooks (None: not offered)
        self.webhook_options = webhook_options or WebhookOptions()
        self.subagents = Subagents(agents, MODES)
        self.services = RunServices(
            models,
            tools if tools is not None else ToolRegistry(),
            bus.waits,
            self.subagents,
            skills,
            options.context_length,
        )
        # the state ports, the runs' services and options: held by the lifecycle
        self.lifecycle = RunLifecycle(
            chats, run_log, bus, uploads, self.services, options, MODES, journal
        )
        if journal is not None:  # a run whose owner another replica lost goes on here
            bus.on_lost(self.lifecycle.resume_lost)
        self.upkeep = ChatUpkeep(
            chats, run_log, bus, uploads.store, journal, self.lifecycle.flush, chat_cleaners
        )

    @property
    def active_runs(self) -> int:
        return self.lifecycle.active_runs

    # -- agents ------------------------------------------------------------------------

    def list_agents(self) -> builtins.list[AgentDefinition]:
        return self.agents.list()

    def get_agent(self, agent_key: str) -> AgentDefinition:
        if not agent_key:
            raise InvalidRequest("agentKey is required")
        return self.agents.get(agent_key)

    # -- runs --------------------------------------------------------------------------

    async def query(self, command: QueryCommand, webhooks: Sequence[Webhook] = ()) -> RunState:
        """Validate `command`, start its run, and return the run (already streaming).

        `webhooks` (the query's) are checked and kept before the run starts."""
        self.lifecycle.admit()
        if not command.agent_key:
            raise InvalidRequest("agentKey is required")
        if not command.message.strip():
            raise InvalidRequest("message is required")
        if (size := len(command.message.encode())) > (
            limit := self.lifecycle.options.max_message_bytes
        ):
            raise PayloadTooLarge(f"message is {size} bytes; the limit is {limit} bytes")
        if command.chat_id:
            check_chat_id(command.chat_id)
        agent = self.agents.get(command.agent_key)
        if command.mode is not None:  # the query chooses among the agent's modes
            agent = agent.in_mode(command.mode)
        agent = with_overrides(agent, command.overrides)  # only what the agent allows
        if not command.started_at_ms:  # the time its prompts' {{date}} and {{now}} say
            command = replace(command, started_at_ms=time.time_ns() // 1_000_000)
        values = PromptValues.of(command)
        for stage in agent.stage_names:  # a prompt variable that cannot be filled fails now
            render(agent.stage(stage).system_prompt, values)
        mode = MODES.get(agent.mode)
        if mode is None:
            raise InvalidRequest(f"agent {agent.key!r}: mode {agent.mode} is not available")
        models = bind_stages(self.services.models, agent)  # an unknown provider or model fails
        named: set[str] = set()  # and so do unknown tools
        for stage in agent.stage_names:
            named.update(
                self.services.tools.for_stage(agent.stage(stage), agent.tool_policy).by_name
            )
        self.subagents.check(agent)  # and unknown subagents, cycles, too deep a nesting
        if command.tools:
            self._check_client_tools(agent, command.tools, named | set(agent.tool_names()))
        if len(webhooks) > MAX_WEBHOOKS:
            raise InvalidRequest(f"webhooks: at most {MAX_WEBHOOKS} for one query")
        checked = [self._client_webhook(w, f"webhooks[{i}]") for i, w in enumerate(webhooks)]
        if command.chat_id:
            await self._check_chat_owner(command.chat_id, command.principal)
        chat_id = command.chat_id or str(uuid.uuid4())
        admission = await self.quotas.admit(command.principal) if self.quotas else None
        kept: list[Webhook] = []
        if checked:
            command = replace(command, run_id=command.run_id or secrets.token_hex(8))
            kept = [await self._keep_webhook(w, command.run_id, command.principal) for w in checked]
        try:
            run = await self.lifecycle.start(command, agent, mode, models, chat_id)
        except BaseException:
            for webhook in kept:  # the run never began: nothing will notify them
                await self._store().remove(command.run_id, webhook.webhook_id)
            if self.quotas is not None and admission is not None:
                await self.quotas.release(admission)
            raise
        if self.quotas is not None and admission is not None:
            self.quotas.bind(admission, run)
        return run

    async def start(self, command: QueryCommand, webhooks: Sequence[Webhook] = ()) -> RunState:
        """Start `command`'s run in the background: like `query`, but the run is not
        cancelled for want of a follower."""
        return await self.query(replace(command, background=True), webhooks)

    async def wait(
        self, run_id: str, timeout_s: float, principal: Principal = ANONYMOUS
    ) -> tuple[events.Event | None, events.Event | None, LiveRun | None]:
        """Wait for `principal`'s run to end, at most `timeout_s`: (its terminal event or
        None, its last event so far, its chat's live run while it runs)."""
        followed = await self.attach(run_id, 0, principal)
        last: events.Event | None = None
        try:
            async with asyncio.timeout(max(timeout_s, MIN_WAIT_S)):
                async for event in followed:
                    last = event
        except TimeoutError:
            pass
        finally:
            await followed.aclose()
        if last is not None and last.WhichOneof("payload") in events.TERMINALS:
            return last, last, None
        live = await self.lifecycle.bus.live_of(last.chat_id) if last is not None else None
        return None, last, live if live is not None and live.run_id == run_id else None

    @staticmethod
    def _check_client_tools(
        agent: AgentDefinition, tools: Sequence[Mapping[str, Any]], taken: set[str]
    ) -> None:
        """The tools a query declares must be allowed, valid, and named apart from the agent's."""
        if not agent.client_tools:
            raise InvalidRequest(
                f"agent {agent.key!r} does not take tools from the client (its file does not "
                'set "clientTools": true); send the query without tools',
                agent_key=agent.key,
            )
        for index, tool in enumerate(client_tools(tools)):
            if tool.name in taken or tool.name in SERVICE_TOOLS:
                raise InvalidRequest(
                    f"tools[{index}].name: {tool.name!r} is a tool agent {agent.key!r} has "
                    "already; name the client's tool otherwise"
                )

    async def _check_chat_owner(self, chat_id: str, principal: Principal) -> None:
        """A chat of another principal is, to this one, a chat that does not exist."""
        summary = await self.lifecycle.chats.summary(chat_id)
        active = await self.lifecycle.bus.active_of(chat_id)
        owner = summary.owner if summary is not None else active.owner if active else principal
        if owner != principal:
            raise ChatNotFound(f"no chat {chat_id!r}", chat_id=chat_id)

    @property
    def runs(self) -> Mapping[str, RunState]:
        """The runs live or recently ended in this process, by id."""
        return self.lifecycle.bus.local_runs()

    def get_run(self, run_id: str, principal: Principal = ANONYMOUS) -> RunState:
        """The live (or recently ended) run `run_id` of this process, if `principal`'s."""
        run = self.lifecycle.bus.local(run_id)
        if run is None or run.owner != principal:
            shown = shorten(run_id)
            raise RunNotFound(f"no active or recent run {shown!r}", run_id=shown)
        return run

    async def is_live(self, run_id: str, principal: Principal = ANONYMOUS) -> bool:
        """Whether `principal`'s run `run_id` is running now (its stream will go on)."""
        found = await self.lifecycle.bus.find(run_id) if valid_run_id(run_id) else None
        return found is not None and found.owner == principal and found.running

    async def attach(
        self, run_id: str, after_seq: int, principal: Principal = ANONYMOUS
    ) -> AsyncGenerator[events.Event, None]:
        """The run's events after `after_seq`: live or recent, else from the run log."""
        if after_seq < 0:
            raise InvalidRequest("afterSeq must be >= 0")
        if not run_id:
            raise InvalidRequest("runId is required")
        found = await self.lifecycle.bus.find(run_id) if valid_run_id(run_id) else None
        if found is not None and found.owner != principal:
            raise RunNotFound(f"no run {shorten(run_id)!r} (unknown or expired)")
        followed = await self.lifecycle.bus.follow(run_id, after_seq) if found is not None else None
        if followed is not None:
            return followed
        kept = await self.lifecycle.run_log.load(run_id) if valid_run_id(run_id) else None
        if kept and not await self._owns_chat(kept[0].chat_id, principal):
            kept = None
        if kept is None:
            shown = shorten(run_id)
            raise RunNotFound(f"no run {shown!r} (unknown or expired)", run_id=shown)

        async def replay_kept() -> AsyncGenerator[events.Event, None]:
            for event in kept[after_seq:]:
                yield event

        return replay_kept()

    async def submit(self, command: SubmitCommand) -> SubmitResult:
        """Deliver a user's answer to a waiting tool of a run."""
        return await self.lifecycle.bus.submit(command)

    async def cancel(
        self, run_id: str, principal: Principal = ANONYMOUS, reason: str = "cancel"
    ) -> bool:
        """Stop `principal`'s running run; False when it had already ended."""
        if not run_id:
            raise InvalidRequest("runId is required")
        found = await self.lifecycle.bus.find(run_id) if valid_run_id(run_id) else None
        cancelled = None
        if found is not None and found.owner == principal:
            cancelled = await self.lifecycle.bus.cancel(run_id, reason)
        if cancelled is None:
            shown = shorten(run_id)
            raise RunNotFound(f"no active or recent run {shown!r}", run_id=shown)
        return cancelled

    async def _owns_chat(self, chat_id: str, principal: Principal) -> bool:
        summary = await self.lifecycle.chats.summary(chat_id) if chat_id else None
        return (summary.owner if summary is not None else ANONYMOUS) == principal

    # -- chats and uploads -------------------------------------------------------------

    async def list_chats(
        self,
        page_size: int = 0,
        page_token: str = "",
        principal: Principal = ANONYMOUS,
        name_contains: str = "",
    ) -> tuple[builtins.list[ChatSummary], str]:
        """A page of `principal`'s chats, newest first, and the next page's token; with
        `name_contains`, only the chats whose name contains it (ignoring case)."""
        if page_size < 0:
            raise InvalidRequest("pageSize must be >= 0")
        if len(name_contains) > MAX_NAME_FILTER:
            raise InvalidRequest(f"nameContains may be at most {MAX_NAME_FILTER} characters")
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        return await self.lifecycle.chats.page(
            size, page_token, owner=principal, name_contains=name_contains
        )

    async def rename_chat(
        self, chat_id: str, chat_name: str, principal: Principal = ANONYMOUS, request_id: str = ""
    ) -> tuple[ChatSummary, events.Event]:
        """Rename `principal`'s chat; its summary and the `chat.update` event recorded."""
        if not chat_id:
            raise InvalidRequest("chatId is required")
        check_chat_id(chat_id)
        return await self.upkeep.rename(chat_id, chat_name, principal, request_id)

    async def delete_chat(
        self, chat_id: str, principal: Principal = ANONYMOUS, *, cancel_active_run: bool = False
    ) -> Deleted:
        """Delete `principal`'s chat and everything of it (see chats/upkeep.py)."""
        if not chat_id:
            raise InvalidRequest("chatId is required")
        check_chat_id(chat_id)
        return await self.upkeep.delete(chat_id, principal, cancel_active_run=cancel_active_run)

    async def expire_chats(self, ttl_s: float) -> builtins.list[str]:
        """Delete every chat unchanged for `ttl_s` (the sweep of `AGW_CHAT_TTL_S`)."""
        return await self.upkeep.expire(ttl_s)

    async def get_chat(
        self,
        chat_id: str,
        principal: Principal = ANONYMOUS,
        *,
        include_records: bool = False,
        history: bool = True,
    ) -> ChatView:
        """The chat's history as replayable events (and its raw records on request); without
        `history`, only its name and live run (its records are not read)."""
        if not chat_id:
            raise InvalidRequest("chatId is required")
        check_chat_id(chat_id)
        summary = await self.lifecycle.chats.summary(chat_id)
        try:
            live = await self.lifecycle.bus.live_of(chat_id)
        except BusUnavailable:  # the history is still there to read; the live run is not
            if summary is None:
                raise
            live = None
        owner = summary.owner if summary is not None else live.owner if live else principal
        if owner != principal:
            raise ChatNotFound(f"no chat {chat_id!r}", chat_id=chat_id)
        shown = live if live is not None and live.owner == principal else None
        chat_name = summary.chat_name if summary else ""
        if not history:
            if summary is None and live is None:
                raise ChatNotFound(f"no chat {chat_id!r}", chat_id=chat_id)
            return ChatView(live_run=shown, chat_id=chat_id, chat_name=chat_name)
        try:
            records = await self.lifecycle.chats.read(chat_id)
        except ChatNotFound:
            if live is None:
                raise
            records = []  # the chat's first run has not written its first record yet
        return ChatView(
            live_run=shown,
            chat_id=chat_id,
            chat_name=chat_name,
            events=replay(records),
            records=records if include_records else [],
            references=[
                ref
                for r in records
                if r.get("_type") == "query"
                for ref in (r.get("query") or {}).get("references") or []
            ],
        )

    async def upload(self, command: UploadCommand) -> StoredUpload:
        """Store an uploaded file that later queries can reference."""
        if command.chat_id:
            check_chat_id(command.chat_id)
            await self._check_chat_owner(command.chat_id, command.principal)
        return await self.lifecycle.uploads.save(
            command.name,
            command.content,
            command.mime_type,
            command.chat_id,
            owner=command.principal,
        )

    # -- spend -------------------------------------------------------------------------

    async def spend(
        self, principal: Principal, tenant: str = "", first_day: str = "", last_day: str = ""
    ) -> tuple[builtins.list[SpendEntry], str, str]:
        """The spend ledger's rows of `tenant` (the caller's own when empty; another, or "*"
        for all, needs "admin") between two UTC days (this month so far by default)."""
        if tenant and tenant != principal.tenant and not principal.has(ADMIN):
            raise PermissionDenied(
                f"reading another tenant's spend needs the role {ADMIN!r}", role=ADMIN
            )
        today = datetime.datetime.now(datetime.UTC).date()
        first = _day(first_day, "firstDay") if first_day else today.replace(day=1)
        last = _day(last_day, "lastDay") if last_day else today
        if last < first or (last - first).days > MAX_SPEND_DAYS:
            raise InvalidRequest(f"lastDay must be from firstDay to {MAX_SPEND_DAYS} days after it")
        wanted = None if tenant == "*" else tenant or principal.tenant
        rows = (
            []
            if self.quotas is None
            else await self.quotas.spend(wanted, first.isoformat(), last.isoformat())
        )
        return rows, first.isoformat(), last.isoformat()

    # -- the webhooks of a run ---------------------------------------------------------

    async def add_webhook(
        self, run_id: str, webhook: Webhook, principal: Principal = ANONYMOUS
    ) -> Webhook:
        """Add a webhook to `principal`'s run (replacing the run's webhook of its id)."""
        await self._owned_run(run_id, principal)
        checked = self._client_webhook(webhook, "webhook")
        if webhook.webhook_id and not valid_webhook_id(webhook.webhook_id):
            raise InvalidRequest("webhookId: 1 to 64 letters, digits, '_', '-' or '.'")
        known = await self._store().of_run(run_id)
        if webhook.webhook_id not in {w.webhook_id for w in known} and len(known) >= MAX_WEBHOOKS:
            raise InvalidRequest(f"run {run_id!r} has {MAX_WEBHOOKS} webhooks already")
        return await self._keep_webhook(
            replace(checked, webhook_id=webhook.webhook_id), run_id, principal
        )

    async def run_webhooks(
        self, run_id: str, principal: Principal = ANONYMOUS
    ) -> builtins.list[Webhook]:
        """The webhooks of `principal`'s run, oldest first."""
        await self._owned_run(run_id, principal)
        return await self._store().of_run(run_id)

    async def run_webhook(
        self, run_id: str, webhook_id: str, principal: Principal = ANONYMOUS
    ) -> Webhook:
        for webhook in await self.run_webhooks(run_id, principal):
            if webhook.webhook_id == webhook_id:
                return webhook
        raise NotFound(f"run {run_id!r} has no webhook {shorten(webhook_id)!r}")

    async def remove_webhook(
        self, run_id: str, webhook_id: str, principal: Principal = ANONYMOUS
    ) -> None:
        await self._owned_run(run_id, principal)
        if not await self._store().remove(run_id, webhook_id):
            raise NotFound(f"run {run_id!r} has no webhook {shorten(webhook_id)!r}")

    def _store(self) -> WebhookStore:
        if self.webhooks is None:
            raise InvalidRequest("webhooks are not offered by this service")
        return self.webhooks

    def _client_webhook(self, webhook: Webhook, what: str) -> Webhook:
        """A webhook a client gives, checked against what the service allows."""
        self._store()
        options = self.webhook_options
        return webhook_of(
            webhook.url,
            allowed_hosts=options.allowed_hosts,
            format=webhook.format,
            secret=webhook.secret,
            token=webhook.token,
            authorization=webhook.authorization,
            signing=options.signing,
            what=what,
        )

    async def _keep_webhook(self, webhook: Webhook, run_id: str, owner: Principal) -> Webhook:
        kept = replace(
            webhook,
            run_id=run_id,
            owner=owner,
            webhook_id=webhook.webhook_id or "wh_" + secrets.token_hex(6),
            created_at_ms=time.time_ns() // 1_000_000,
        )
        await self._store().add(kept)
        return kept

    async def _owned_run(self, run_id: str, principal: Principal) -> None:
        """`principal`'s run, live, recent or kept in the run log; RunNotFound otherwise."""
        if not run_id:
            raise InvalidRequest("runId is required")
        found = await self.lifecycle.bus.find(run_id) if valid_run_id(run_id) else None
        if found is not None and found.owner == principal:
            return
        kept = await self.lifecycle.run_log.load(run_id) if valid_run_id(run_id) else None
        if found is None and kept and await self._owns_chat(kept[0].chat_id, principal):
            return
        shown = shorten(run_id)
        raise RunNotFound(f"no run {shown!r} (unknown or expired)", run_id=shown)

    # -- the files of a chat's workspace ----------------------------------------------

    async def list_files(
        self, chat_id: str, principal: Principal = ANONYMOUS
    ) -> builtins.list[WorkspaceFile]:
        """The files the chat's tools wrote in its workspace, for the chat's owner."""
        await self._visible_chat(chat_id, principal)
        return await self.files.list(chat_id) if self.files is not None else []

    async def download(
        self, chat_id: str, path: str, principal: Principal = ANONYMOUS
    ) -> tuple[WorkspaceFile, FileContent]:
        """A file of the chat's workspace and its bytes, for the chat's owner, up to the
        download limit."""
        await self._visible_chat(chat_id, principal)
        if not path:
            raise InvalidRequest("path is required")
        if self.files is None:
            raise NotFound(f"no file {shorten(path)!r} in the workspace of chat {chat_id!r}")
        return await self.files.read(chat_id, path, self.download_max_bytes, DOWNLOAD_CHUNK_BYTES)

    async def _visible_chat(self, chat_id: str, principal: Principal) -> None:
        """The chat must exist and be `principal`'s (to anyone else it does not exist)."""
        if not chat_id:
            raise InvalidRequest("chatId is required")
        check_chat_id(chat_id)
        summary = await self.lifecycle.chats.summary(chat_id)
        active = await self.lifecycle.bus.active_of(chat_id) if summary is None else None
        owner = summary.owner if summary is not None else active.owner if active else None
        if owner != principal:
            raise ChatNotFound(f"no chat {chat_id!r}", chat_id=chat_id)

    # -- lifecycle ---------------------------------------------------------------------

    async def open(self) -> None:
        """Prepare the stores and the bus before the first request."""
        await self.lifecycle.chats.open()
        await self.lifecycle.run_log.open()
        await self.lifecycle.uploads.open()
        await self.lifecycle.bus.open()
        if self.lifecycle.journal is not None:
            await self.lifecycle.journal.open()
        if self.quotas is not None:
            await self.quotas.open()
        await self.catalog.open()
        if self.webhooks is not None:
            await self.webhooks.open()

    async def resume(self, reason: str = "restart") -> list[RunState]:
        """Resume the runs this service's journal holds unfinished (see lifecycle.py)."""
        return await self.lifecycle.resume_unfinished(reason)

    async def drain(self, grace_s: float, delay_s: float = 0.0) -> None:
        """Refuse new runs; hand over after `delay_s` the runs another replica can go on with
        at once; let the others finish within `grace_s`, then hand them over (journaled runs)
        or cancel them (see `RunLifecycle.drain`)."""
        await self.lifecycle.drain(grace_s, delay_s)

    async def close(self) -> None:
        """Disconnect from the bus and close the journal, after the drain."""
        await self.lifecycle.bus.close()
        if self.lifecycle.journal is not None:
            await self.lifecycle.journal.close()
        if self.quotas is not None:
            await self.quotas.close()
        await self.catalog.close()
        if self.webhooks is not None:
            await self.webhooks.close()

    async def flush(self) -> None:
        """Wait until every ended run is recorded, kept in the run log and in the ledger."""
        await self.lifecycle.flush()
        if self.quotas is not None:
            await self.quotas.flush()
