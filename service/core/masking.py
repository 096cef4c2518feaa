"""Masking of secrets in anything logged or emitted (interaction log, debug events)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

MASK = "***"
_SENSITIVE = ("authorization", "apikey", "secret", "password", "passwd", "credential")


def is_sensitive(key: str) -> bool:
    """authorization / api_key / apikey / token / secret / password, any case.

    "token" matches as a word ending (`access_token`, `X-Auth-Token`) so that
    counters like `max_tokens` stay visible.
    """
    k = key.lower().replace("-", "").replace("_", "")
    return k.endswith("token") or any(s in k for s in _SENSITIVE)


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
