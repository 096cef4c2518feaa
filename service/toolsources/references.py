"""Environment references in tool source configuration, and keeping their values secret.

A configured value (an HTTP header, a URL, an MCP server's environment variable)
may contain `${ENV:NAME}` references, replaced by the service's environment
variable NAME when the value is used, so that credentials are written nowhere
but in the environment. `Expanded` keeps the resolved values to mask them (by
value, also URL-encoded) in any text that leaves the source: error results,
log lines. `public_url` is the form of a URL that may be shown: no user info,
no query, no fragment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit, urlunsplit

from service.core.masking import SecretMask

REFERENCE = re.compile(r"\$\{ENV:([A-Za-z_][A-Za-z0-9_]*)\}")


class MissingVariable(LookupError):
    """A referenced environment variable is not set."""

    def __init__(self, name: str) -> None:
        super().__init__(f"environment variable {name} is not set")
        self.name = name


def references(text: str) -> list[str]:
    """The names of the environment variables `text` refers to."""
    return REFERENCE.findall(text)


@dataclass(slots=True)
class Expanded:
    """Expands references against an environment and remembers the values it put in."""

    environ: Mapping[str, str]
    secrets: set[str] = field(default_factory=set)

    def text(self, value: str) -> str:
        """`value` with each `${ENV:NAME}` replaced; `MissingVariable` if one is not set."""

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in self.environ:
                raise MissingVariable(name)
            resolved = self.environ[name]
            self.secrets.add(resolved)
            return resolved

        return REFERENCE.sub(replace, value)

    def mapping(self, values: Mapping[str, str]) -> dict[str, str]:
        """Each value of `values` expanded."""
        return {key: self.text(value) for key, value in values.items()}

    def mask(self) -> SecretMask:
        """Masks every value expanded so far, as written and URL-encoded."""
        forms = set(self.secrets)
        forms.update(quote(secret, safe="") for secret in self.secrets)
        forms.update(quote(secret) for secret in self.secrets)
        return SecretMask(forms)


def public_url(url: str) -> str:
    """`url` without user info, query and fragment (references left as written)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = f"{host}:{port}" if port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def cut(text: str, limit_bytes: int, what: str = "output") -> str:
    """`text` cut to `limit_bytes` of UTF-8, the cut marked with the full size."""
    encoded = text.encode("utf-8")
    if len(encoded) <= limit_bytes:
        return text
    kept = encoded[:limit_bytes].decode("utf-8", errors="ignore")
    return f"{kept}\n[{what} cut: {len(encoded)} bytes, the limit is {limit_bytes}]"
