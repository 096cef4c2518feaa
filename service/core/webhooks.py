"""Webhooks: who is told what becomes of a run, and the notifications queued for them.

A run's webhooks come from three places: the query that started it (`QueryRequest.webhooks`,
registered before the run starts), later calls (`CreateRunWebhook`, an A2A push
configuration), and the service's and the agent's own (`webhook_urls`, the agent file's
`webhooks`: not stored, added to every run of theirs). What a webhook is sent depends on its
format: `agw` is told the run's end; `a2a` and `a2a_v03` each change of the run's A2A task
state (service/core/notifier.py watches the runs).

A notification waits in the `WebhookStore` until its receiver took it (a 2xx answer) or
its attempts ran out, so that it outlives the process: the sender (service/notify/) takes
the due ones, POSTs them, and retries with a doubling back-off. Each has a stable id
(its webhook, its run, its event), which the receiver sees on every attempt and a
notification queued twice keeps: delivery is at least once, and the id tells copies apart.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

from service.core.errors import InvalidRequest
from service.core.ids import ANONYMOUS, Principal

Format = Literal["agw", "a2a", "a2a_v03"]
#: A2A task states a notification says (the agw form is told the end only).
State = Literal["working", "input-required", "completed", "failed", "canceled"]
TERMINAL_STATES: frozenset[str] = frozenset({"completed", "failed", "canceled"})
MAX_URL_CHARS = 2048
MAX_WEBHOOKS = 16  # a run's, besides the service's and its agent's


@dataclass(frozen=True, slots=True)
class Webhook:
    """Where a run's notifications go: a URL, its format, how it is signed and authorized."""

    url: str
    format: Format = "agw"
    secret: str = field(default="", repr=False)  # "": the service's webhook_secret
    token: str = ""  # sent back as X-A2A-Notification-Token
    authorization: str = field(default="", repr=False)  # the Authorization header, if any
    webhook_id: str = ""  # within its run; "" for the service's and agents' own
    run_id: str = ""
    owner: Principal = ANONYMOUS
    created_at_ms: int = 0

    @property
    def key(self) -> str:
        """What identifies it among a run's webhooks (its id, else its URL)."""
        return self.webhook_id or self.url

    def to_record(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "format": self.format,
            "secret": self.secret,
            "token": self.token,
            "authorization": self.authorization,
            "webhookId": self.webhook_id,
            "runId": self.run_id,
            "owner": self.owner.to_record(),
            "createdAt": self.created_at_ms,
        }

    @staticmethod
    def from_record(data: dict[str, Any]) -> Webhook:
        return Webhook(
            url=str(data["url"]),
            format=data.get("format", "agw"),
            secret=str(data.get("secret", "")),
            token=str(data.get("token", "")),
            authorization=str(data.get("authorization", "")),
            webhook_id=str(data.get("webhookId", "")),
            run_id=str(data.get("runId", "")),
            owner=Principal.from_record(data.get("owner")),
            created_at_ms=int(data.get("createdAt", 0)),
        )


@dataclass(frozen=True, slots=True)
class Notice:
    """What happened to a run: its new A2A task state, and the event that says so."""

    run_id: str
    chat_id: str
    agent_key: str
    seq: int
    state: State
    event: bytes  # the agw.v1.Event, serialized
    timestamp_ms: int

    def to_record(self) -> dict[str, Any]:
        return {
            "runId": self.run_id,
            "chatId": self.chat_id,
            "agentKey": self.agent_key,
            "seq": self.seq,
            "state": self.state,
            "event": self.event.hex(),
            "timestamp": self.timestamp_ms,
        }

    @staticmethod
    def from_record(data: dict[str, Any]) -> Notice:
        return Notice(
            run_id=str(data["runId"]),
            chat_id=str(data["chatId"]),
            agent_key=str(data.get("agentKey", "")),
            seq=int(data["seq"]),
            state=data["state"],
            event=bytes.fromhex(str(data["event"])),
            timestamp_ms=int(data["timestamp"]),
        )


@dataclass(frozen=True, slots=True)
class Delivery:
    """A notification to send to a webhook: its stable id, and how far its attempts got."""

    delivery_id: str
    webhook: Webhook
    notice: Notice
    attempts: int = 0  # failed so far
    next_at_ms: int = 0  # when it is due

    @staticmethod
    def of(webhook: Webhook, notice: Notice) -> Delivery:
        seed = f"{webhook.key}|{notice.run_id}|{notice.seq}|{notice.state}"
        digest = hashlib.sha256(seed.encode()).hexdigest()[:32]
        return Delivery(f"whd_{digest}", webhook, notice, 0, notice.timestamp_ms)


class WebhookStore(Protocol):
    """The runs' webhooks and the notifications due to them, kept durably (service/state/)."""

    async def open(self) -> None:
        """Prepare the store (create its place, connect, forget what expired)."""
        ...

    async def close(self) -> None:
        """Release what the store holds; no call follows."""
        ...

    async def add(self, webhook: Webhook) -> None:
        """Keep a run's webhook (replacing the run's webhook of that id)."""
        ...

    async def of_run(self, run_id: str) -> list[Webhook]:
        """A run's webhooks, oldest first."""
        ...

    async def remove(self, run_id: str, webhook_id: str) -> bool:
        """Forget a run's webhook; False when it had none of that id."""
        ...

    async def enqueue(self, deliveries: Sequence[Delivery]) -> None:
        """Queue notifications (one already queued under the same id stays as it is)."""
        ...

    async def due(self, now_ms: int, limit: int, lease_ms: int) -> list[Delivery]:
        """At most `limit` notifications due by `now_ms`, oldest first, each taken for
        `lease_ms` (not due again meanwhile, so no other sender takes it)."""
        ...

    async def next_due(self) -> int | None:
        """When the next queued notification is due (ms), or None when none is queued."""
        ...

    async def delivered(self, delivery_id: str) -> None:
        """The receiver took it: forget it."""
        ...

    async def retry(self, delivery_id: str, attempts: int, next_at_ms: int) -> None:
        """An attempt failed: note it, and make it due again at `next_at_ms`."""
        ...


@dataclass(frozen=True, slots=True)
class WebhookOptions:
    """What the service allows the webhooks clients give (queries, CreateRunWebhook)."""

    allowed_hosts: tuple[str, ...] = ()  # the hosts their URLs may name ("*": any)
    signing: bool = False  # the service has a secret of its own to sign with


def webhook_of(
    url: str,
    *,
    allowed_hosts: Sequence[str],
    format: Format = "agw",
    secret: str = "",
    token: str = "",
    authorization: str = "",
    signing: bool = True,
    what: str = "webhook",
) -> Webhook:
    """A webhook a client asks for, checked: an http(s) URL on an allowed host (a client may
    not make the service call any address it likes), a key to sign with for the agw form.
    `signing`: whether the service has a secret of its own."""
    checked_url(url, allowed_hosts, what)
    if format == "agw" and not (secret or signing):
        raise InvalidRequest(
            f"{what}: give it a secret (the service has no webhook_secret to sign with)"
        )
    for name, value in (("token", token), ("authorization", authorization)):
        if len(value) > 4096 or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            raise InvalidRequest(f"{what}.{name}: at most 4096 printable characters")
    return Webhook(url, format, secret, token, authorization)


def checked_url(url: str, allowed_hosts: Sequence[str], what: str = "webhook") -> str:
    """`url`, when a client may have the service POST to it; InvalidRequest otherwise."""
    if len(url) > MAX_URL_CHARS:
        raise InvalidRequest(f"{what}.url: longer than {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        parts.port  # noqa: B018 (a port that is not a number raises)
    except ValueError:
        raise InvalidRequest(f"{what}.url: not a URL") from None
    if parts.scheme not in ("http", "https") or not host:
        raise InvalidRequest(f"{what}.url: must be an http or https URL")
    if parts.username or parts.password:
        raise InvalidRequest(f"{what}.url: may not carry credentials (use authorization)")
    if not host_allowed(host, allowed_hosts):
        raise InvalidRequest(
            f"{what}.url: host {host[:100]!r} is not one the service may call (the setting "
            "webhook_allowed_hosts lists them)"
        )
    return url


def host_allowed(host: str, allowed: Sequence[str]) -> bool:
    """Whether `host` is listed: exactly, as a subdomain of a ".domain" entry, or by "*"."""
    for entry in allowed:
        entry = entry.lower().strip("[]")
        if entry == "*" or host.strip("[]") == entry:
            return True
        if entry.startswith(".") and (host == entry[1:] or host.endswith(entry)):
            return True
        try:
            if ipaddress.ip_address(host.strip("[]")) in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False
