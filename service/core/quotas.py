"""Quotas per tenant and per API key, and the spend ledger.

Each tenant (`tenants`, "*" for any tenant not named) and each API key (`keys`, by the
key's name) may have limits on
- `concurrent_runs`: runs in progress at once (a slot per run, taken when the query is
  admitted and given back when its run ends);
- `requests_per_minute`: queries started per UTC minute (a fixed window);
- `tokens_per_day`: prompt and completion tokens of its runs' model calls per UTC day;
- `spend_per_month`: the cost of those calls (the price table's currency) per UTC month.

A query is admitted only if every limit of its caller's tenant and key holds; else it is
refused with `QuotaExceeded` (RESOURCE_EXHAUSTED), naming the quota, its scope and limit,
and when to retry (`retry_after_s`). Tokens and spend are counted as each model call ends;
a run in progress is not stopped when its caller goes over them: the next query is
refused. The counters (`QuotaCounters`) are in Redis when replicas share one, so every
replica sees the same; else in process.

Every model call also goes into the spend ledger (`SpendLedger`): calls, tokens and cost
per UTC day, tenant, API key, agent and model, written when its run ends (whether it
completes, fails or is cancelled).
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from service.core.errors import QuotaExceeded
from service.core.ids import Principal
from service.core.model import ModelRequest
from service.core.ports import QuotaCounters, SpendLedger
from service.core.run.results import TurnResult
from service.core.run.state import RunState
from service.core.values import SpendEntry

log = logging.getLogger("agw.quotas")

#: The tenant whose limits stand for every tenant not named.
ANY_TENANT = "*"
#: Spend is counted in millionths of the currency (the counters are integers).
MICROS = 1_000_000
#: When a query refused for too many runs in progress is told to retry.
BUSY_RETRY_S = 5.0


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits of one tenant or API key (None: no limit)."""

    concurrent_runs: int | None = None
    requests_per_minute: int | None = None
    tokens_per_day: int | None = None
    spend_per_month: float | None = None


@dataclass(frozen=True, slots=True)
class QuotaOptions:
    """The limits by tenant and by API key name, and how long a run's slot lives unrenewed
    (a replica that died gives its slots back after it)."""

    tenants: Mapping[str, Limits] = field(default_factory=dict)
    keys: Mapping[str, Limits] = field(default_factory=dict)
    slot_ttl_s: float = 60.0

    @property
    def any(self) -> bool:
        return bool(self.tenants or self.keys)


@dataclass(eq=False)
class Admission:
    """The run slots an admitted query took, given back once when its run ends."""

    counters: QuotaCounters
    slots: list[tuple[str, str]] = field(default_factory=list)  # (set key, member)

    async def give_back(self) -> None:
        slots, self.slots = self.slots, []
        for key, member in slots:
            try:
                await self.counters.give_back(key, member)
            except Exception:  # the slot expires by itself
                log.warning("could not give back the run slot %s of %s", member, key)


@dataclass(slots=True)
class _Scope:
    kind: str  # "tenant" or "key"
    name: str
    limits: Limits

    def key(self, what: str, period: str = "") -> str:
        return f"{what}:{self.kind}:{self.name}" + (f":{period}" if period else "")

    def refuse(self, quota: str, limit: object, retry_after_s: float, text: str) -> QuotaExceeded:
        return QuotaExceeded(
            f"{self.kind} {self.name!r} used its quota of {text}; retry in "
            f"{max(1, round(retry_after_s))} s",
            quota=quota,
            scope=self.kind,
            limit=str(limit),
            retry_after_s=f"{retry_after_s:.3f}",
        )


def _day(now: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(now))


def _month(now: float) -> str:
    return time.strftime("%Y-%m", time.gmtime(now))


def _to_next_day(now: float) -> float:
    return 86400.0 - now % 86400.0


def _to_next_month(now: float) -> float:
    moment = datetime.fromtimestamp(now, UTC)
    days = calendar.monthrange(moment.year, moment.month)[1]
    start = datetime(moment.year, moment.month, 1, tzinfo=UTC).timestamp()
    return start + days * 86400.0 - now


class Quotas:
    """Admits queries by their caller's limits, counts what runs use, keeps the ledger.

    Also a middleware of the runs (`on_run_start`, `on_run_end`: service/core/middleware.py),
    so that it sees every model call of every run, resumed ones included.
    """

    def __init__(
        self,
        counters: QuotaCounters,
        ledger: SpendLedger | None,
        options: QuotaOptions | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.counters = counters
        self.ledger = ledger
        self.options = options if options is not None else QuotaOptions()
        self.clock = clock
        self._held: dict[tuple[str, str], None] = {}  # run slots held here, renewed
        self._spent: dict[str, dict[tuple[str, str], SpendEntry]] = {}  # run id -> rows
        self._tasks: set[asyncio.Task[None]] = set()
        self._renewer: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------

    async def open(self) -> None:
        await self.counters.open()
        if self.ledger is not None:
            await self.ledger.open()
        if self.options.any:
            self._renewer = asyncio.create_task(self._renew(), name="quota-slots")

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        await self.flush()
        await self.counters.close()
        if self.ledger is not None:
            await self.ledger.close()

    async def flush(self) -> None:
        """Wait until what ended runs used is counted and in the ledger."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def _renew(self) -> None:
        ttl = self.options.slot_ttl_s
        while True:
            await asyncio.sleep(ttl / 3)
            for key, member in list(self._held):
                try:
                    await self.counters.renew(key, member, ttl)
                except Exception:
                    log.warning("could not renew the run slot %s of %s", member, key)

    # -- admission ---------------------------------------------------------------------

    def _scopes(self, principal: Principal) -> list[_Scope]:
        options = self.options
        scopes = []
        tenant = options.tenants.get(principal.tenant) or options.tenants.get(ANY_TENANT)
        if tenant is not None:
            scopes.append(_Scope("tenant", principal.tenant, tenant))
        key = options.keys.get(principal.key) if principal.key else None
        if key is not None:
            scopes.append(_Scope("key", principal.key, key))
        return scopes

    async def admit(self, principal: Principal) -> Admission:
        """Admit a query of `principal` (taking its run slots), or raise `QuotaExceeded`."""
        admission = Admission(self.counters)
        try:
            for scope in self._scopes(principal):
                await self._check(scope, admission)
        except BaseException:
            await admission.give_back()
            raise
        return admission

    async def _check(self, scope: _Scope, admission: Admission) -> None:
        limits, now = scope.limits, self.clock()
        if limits.tokens_per_day is not None:
            used = await self.counters.value(scope.key("tokens", _day(now)))
            if used >= limits.tokens_per_day:
                text = f"{limits.tokens_per_day} tokens a day"
                raise scope.refuse("tokens_per_day", limits.tokens_per_day, _to_next_day(now), text)
        if limits.spend_per_month is not None:
            used = await self.counters.value(scope.key("spend", _month(now)))
            if used >= limits.spend_per_month * MICROS:
                text = f"{limits.spend_per_month:g} of spend a month"
                retry = _to_next_month(now)
                raise scope.refuse("spend_per_month", limits.spend_per_month, retry, text)
        if limits.requests_per_minute is not None:
            minute = int(now // 60)
            count = await self.counters.add(scope.key("requests", str(minute)), 1, 120.0)
            if count > limits.requests_per_minute:
                text = f"{limits.requests_per_minute} requests a minute"
                retry = 60.0 - now % 60.0
                raise scope.refuse("requests_per_minute", limits.requests_per_minute, retry, text)
        if limits.concurrent_runs is not None:
            key, member = scope.key("runs"), uuid.uuid4().hex
            limit = limits.concurrent_runs
            if not await self.counters.take(key, member, limit, self.options.slot_ttl_s):
                text = f"{limit} runs in progress at once"
                raise scope.refuse("concurrent_runs", limit, BUSY_RETRY_S, text)
            admission.slots.append((key, member))
            self._held[(key, member)] = None

    def bind(self, admission: Admission, run: RunState) -> None:
        """Give `admission`'s run slots back when `run`'s task ends (however it ends)."""
        if not admission.slots:
            return
        task = run.task
        if task is None or task.done():
            self._spawn(self._release(admission))
            return
        task.add_done_callback(lambda _: self._spawn(self._release(admission)))

    async def release(self, admission: Admission) -> None:
        """Give back the slots of a query whose run never started."""
        await self._release(admission)

    async def _release(self, admission: Admission) -> None:
        for slot in admission.slots:
            self._held.pop(slot, None)
        await admission.give_back()

    # -- what runs use (a middleware of every run) -------------------------------------

    def on_run_start(self, run: RunState) -> None:
        run.observe_turns(_TurnsOf(self, run))  # (its rows are made at its first turn)

    def _turn(self, run: RunState, request: ModelRequest, result: TurnResult) -> None:
        owner, now = run.owner, self.clock()
        usage = result.usage
        prompt = usage.prompt_tokens if usage is not None else 0
        completion = usage.completion_tokens if usage is not None else 0
        rows = self._spent.setdefault(run.run_id, {})
        day = _day(now)
        before = rows.get((day, request.model))
        rows[(day, request.model)] = SpendEntry(
            day,
            owner.tenant,
            owner.key,
            run.agent_key,
            request.model,
            (before.calls if before else 0) + 1,
            (before.prompt_tokens if before else 0) + prompt,
            (before.completion_tokens if before else 0) + completion,
            (before.cost if before else 0.0) + result.cost,
        )
        counted = [s for s in self._scopes(owner) if s.limits != Limits()]
        if counted and (prompt or completion or result.cost):
            self._spawn(self._count(counted, now, prompt + completion, result.cost))

    async def _count(self, scopes: list[_Scope], now: float, tokens: int, cost: float) -> None:
        for scope in scopes:
            if tokens:
                await self.counters.add(scope.key("tokens", _day(now)), tokens, 2 * 86400.0)
            if cost:
                micros = round(cost * MICROS)
                await self.counters.add(scope.key("spend", _month(now)), micros, 32 * 86400.0)

    def on_run_end(self, run: RunState, terminal: object) -> None:
        rows = self._spent.pop(run.run_id, None)
        if rows and self.ledger is not None:
            self._spawn(self.ledger.add(list(rows.values())))

    def _spawn(self, work: Awaitable[object]) -> None:
        async def guarded() -> None:
            try:
                await work
            except Exception:
                log.exception("could not count what a run used")

        task = asyncio.get_running_loop().create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the ledger --------------------------------------------------------------------

    async def spend(self, tenant: str | None, first_day: str, last_day: str) -> list[SpendEntry]:
        """The ledger's rows of `tenant` (None: every tenant) between the two days."""
        if self.ledger is None:
            return []
        await self.flush()
        return await self.ledger.read(tenant, first_day, last_day)


class _TurnsOf:
    """Sees the model turns of one run for the quotas (an object rather than a closure, its
    function and cells, held for as long as the run runs)."""

    __slots__ = ("quotas", "run")

    def __init__(self, quotas: Quotas, run: RunState) -> None:
        self.quotas = quotas
        self.run = run

    def __call__(self, request: ModelRequest, result: TurnResult) -> None:
        self.quotas._turn(self.run, request, result)
