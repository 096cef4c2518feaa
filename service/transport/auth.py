"""Who calls: API keys and JWT bearer tokens, resolved to a `Principal`.

A call carries its credential in the `authorization` header (gRPC metadata; the
HTTP adapter forwards its own header unchanged): `Bearer <token>`, where the
token is either one of the configured API keys or a JWT. API keys are compared
by their SHA-256 in constant time and map to a fixed tenant and subject. A JWT
is verified with PyJWT: its signature (a key from the issuer's JWKS URL, a PEM
public key, or a shared HMAC secret), its expiry and not-before (with a small
leeway), and the configured issuer and audience; its `sub` claim is the subject
and a configurable claim the tenant.

With neither keys nor JWT configured, authentication is off and every caller is
the anonymous principal.

Roles: an API key lists its roles; a JWT names them in a claim (`roles` by default,
a list or a string of names split by blanks). The agent store's RPCs need "admin"
(`ADMIN`); with authentication off the one anonymous caller holds every role.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jwt

from service.core.errors import Unauthenticated
from service.core.ids import EVERY_ROLE, Principal

log = logging.getLogger("agw.auth")

#: Every caller while authentication is off: the anonymous principal, holding every role.
UNCHECKED = Principal(roles=frozenset({EVERY_ROLE}))


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One accepted API key (by its SHA-256 hex digest) and whom it stands for."""

    sha256: str
    principal: Principal


@dataclass(frozen=True, slots=True)
class JwtOptions:
    """How bearer JWTs are verified. One of `jwks_url`, `public_key`, `secret` is set."""

    jwks_url: str = ""
    public_key: str = ""  # PEM
    secret: str = ""  # HMAC (HS256/384/512)
    algorithms: tuple[str, ...] = ("RS256", "ES256")
    issuer: str = ""
    audience: str = ""
    tenant_claim: str = "tenant"
    roles_claim: str = "roles"  # a list of role names, or one string of them split by blanks
    default_tenant: str = "default"
    leeway_s: float = 30.0
    jwks_cache_s: float = 300.0


@dataclass(slots=True)
class Authenticator:
    """Resolves the `authorization` header of a call to its principal."""

    api_keys: Sequence[ApiKey] = ()
    jwt_options: JwtOptions | None = None
    _jwks: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        options = self.jwt_options
        if options is not None and options.jwks_url:
            self._jwks = jwt.PyJWKClient(
                options.jwks_url, cache_keys=True, lifespan=int(options.jwks_cache_s)
            )

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys) or self.jwt_options is not None

    async def authenticate(self, metadata: Mapping[str, str]) -> Principal:
        """The principal of a call with these headers; Unauthenticated when none fits."""
        if not self.enabled:
            return UNCHECKED
        header = metadata.get("authorization", "")
        scheme, _, token = header.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated(
                "missing credentials: send 'authorization: Bearer <API key or token>'"
            )
        digest = hashlib.sha256(token.encode()).hexdigest()
        for key in self.api_keys:
            if hmac.compare_digest(digest, key.sha256):
                return key.principal
        if self.jwt_options is not None and token.count(".") == 2:
            return await self._verify(token, self.jwt_options)
        raise Unauthenticated("invalid credentials")

    async def _verify(self, token: str, options: JwtOptions) -> Principal:
        try:
            key: Any
            if self._jwks is not None:  # the issuer's keys, fetched (and cached) off the loop
                key = (await asyncio.to_thread(self._jwks.get_signing_key_from_jwt, token)).key
            else:
                key = options.public_key or options.secret
            claims = jwt.decode(
                token,
                key,
                algorithms=list(options.algorithms),
                audience=options.audience or None,
                issuer=options.issuer or None,
                leeway=options.leeway_s,
                options={
                    "require": ["exp", "sub"],
                    "verify_aud": bool(options.audience),
                },
            )
        except jwt.PyJWKClientError as error:
            log.warning("could not get the signing key of a token: %s", error)
            raise Unauthenticated("invalid token: no signing key for it") from None
        except jwt.InvalidTokenError as error:
            raise Unauthenticated(f"invalid token: {error}") from None
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise Unauthenticated("invalid token: no subject")
        tenant = claims.get(options.tenant_claim, options.default_tenant)
        return Principal(str(tenant), subject, roles=roles_of(claims.get(options.roles_claim)))


def roles_of(claim: object) -> frozenset[str]:
    """The roles a token's claim names: a list of names, or one string of them (as OAuth's
    `scope`); anything else names none."""
    if isinstance(claim, str):
        return frozenset(claim.split())
    if isinstance(claim, list):
        return frozenset(role for role in claim if isinstance(role, str) and role)
    return frozenset()


def api_key(
    secret: str, tenant: str, subject: str, *, name: str = "", roles: Iterable[str] = ()
) -> ApiKey:
    """An accepted key given in clear (or as `sha256:<hex>`); `name` names the key (its
    quotas, its spend), by default its subject."""
    if secret.startswith("sha256:"):
        digest = secret.removeprefix("sha256:").lower()
    else:
        digest = hashlib.sha256(secret.encode()).hexdigest()
    return ApiKey(digest, Principal(tenant, subject, key=name or subject, roles=frozenset(roles)))
