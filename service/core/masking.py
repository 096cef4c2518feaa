"""Masking of secrets in anything logged or emitted (interaction log, debug events).

Two complementary ways: by key (`mask`, `is_sensitive`, `is_secret_header`:
the value under a name that looks secret is hidden) and by value (`SecretMask`:
every occurrence of a known secret, such as a provider's API key echoed back
in an error body, is replaced wherever it appears in a text).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"
_SENSITIVE = ("authorization", "apikey", "secret", "password", "passwd", "credential")
_SECRET_HEADER = ("auth", "key", "token", "secret", "password", "passwd", "credential", "cookie")
MIN_SECRET_CHARS = 4
"""Shorter values are not masked by value: they would hide common text, not a secret."""


def is_sensitive(key: str) -> bool:
    """authorization / api_key / apikey / token / secret / password, any case.

    "token" matches as a word ending (`access_token`, `X-Auth-Token`) so that
    counters like `max_tokens` stay visible.
    """
    k = key.lower().replace("-", "").replace("_", "")
    return k.endswith("token") or any(s in k for s in _SENSITIVE)


def is_secret_header(name: str) -> bool:
    """An HTTP header whose value is a credential: its name contains auth, key, token,
    secret, password, passwd, credential or cookie, any case (`Authorization`,
    `Ocp-Apim-Subscription-Key`, `X-Auth-Token`, `Cookie`)."""
    n = name.lower()
    return any(s in n for s in _SECRET_HEADER)


def mask(value: Any) -> Any:
    """A copy of `value` with the values of sensitive keys replaced, at any depth."""
    if isinstance(value, Mapping):
        return {k: MASK if is_sensitive(str(k)) else mask(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask(v) for v in value]
    if isinstance(value, str) and value[:1] == "{":
        try:
            inner = json.loads(value)
        except ValueError:
            return value
        masked = mask(inner)
        return value if masked == inner else json.dumps(masked, ensure_ascii=False)
    return value


class SecretMask:
    """Replaces every occurrence of known secret values in a text by `MASK`.

    Apply it before any truncation: a cut made after masking cannot keep part of
    a secret. A text that already ends inside a secret (cut by its producer) has
    that trailing fragment masked too, when it is at least `MIN_SECRET_CHARS` long.
    """

    __slots__ = ("_secrets",)

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        found = {s for s in secrets if len(s) >= MIN_SECRET_CHARS}
        self._secrets = tuple(sorted(found, key=len, reverse=True))  # longest first

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def __call__(self, text: str) -> str:
        """`text` with every known secret, and a trailing fragment of one, masked."""
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
            text = _mask_trailing_prefix(text, secret)
        return text

    def clip(self, text: str, limit: int) -> str:
        """`text` masked, then cut to `limit` characters (with "…" when cut)."""
        text = self(text)
        if len(text) <= limit:
            return text
        cut = text[:limit]
        for secret in self._secrets:  # a fragment the producer had already cut
            cut = _mask_trailing_prefix(cut, secret)
        return cut + "…"


def _mask_trailing_prefix(text: str, secret: str) -> str:
    """`text` with its end masked when it is the beginning of `secret` (a cut secret)."""
    start = max(0, len(text) - len(secret) + 1)
    head = secret[:MIN_SECRET_CHARS]
    at = text.find(head, start)
    while at >= 0:
        if secret.startswith(text[at:]):
            return text[:at] + MASK
        at = text.find(head, at + 1)
    return text
