"""Security settings → the authenticator, the TLS material, and the exposure check.

The service refuses to start when it would serve a non-loopback address with
no authentication, unless `allow_unauthenticated` says that is intended (for
example behind a gateway that authenticates).
"""

from __future__ import annotations

import ipaddress
import ssl
import tempfile
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509

from service.assembly.config import CannotStart, Settings
from service.transport.auth import Authenticator, JwtOptions, api_key

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class UnsafeExposure(CannotStart):
    """The settings would serve a network address with no authentication."""


def authenticator(settings: Settings) -> Authenticator:
    """The authenticator the settings describe (disabled when they describe none)."""
    keys = [
        api_key(k.key.get_secret_value(), k.tenant, k.subject, name=k.name, roles=k.roles)
        for k in settings.auth_api_keys
    ]
    secret = settings.auth_jwt_secret.get_secret_value()
    jwt_options = None
    if settings.auth_jwt_jwks_url or settings.auth_jwt_public_key or secret:
        algorithms = settings.auth_jwt_algorithms or (
            ["HS256"] if secret and not settings.auth_jwt_jwks_url else ["RS256", "ES256"]
        )
        jwt_options = JwtOptions(
            jwks_url=settings.auth_jwt_jwks_url,
            public_key=settings.auth_jwt_public_key,
            secret=secret,
            algorithms=tuple(algorithms),
            issuer=settings.auth_jwt_issuer,
            audience=settings.auth_jwt_audience,
            tenant_claim=settings.auth_jwt_tenant_claim,
            roles_claim=settings.auth_jwt_roles_claim,
        )
    return Authenticator(keys, jwt_options)


def is_loopback(address: str) -> bool:
    """Whether "host:port" binds only the loopback interface."""
    host = address.rpartition(":")[0].strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "" or "0.0.0.0"-like wildcards, or a host name


def check_exposure(settings: Settings, auth: Authenticator) -> None:
    """Refuse to serve a non-loopback address without authentication (unless allowed)."""
    if auth.enabled or settings.allow_unauthenticated:
        return
    exposed = [settings.grpc_address] if not is_loopback(settings.grpc_address) else []
    if settings.http_enabled and not is_loopback(settings.http_address):
        exposed.append(settings.http_address)
    if exposed:
        raise UnsafeExposure(
            f"refusing to serve {', '.join(exposed)} without authentication: configure "
            "AGW_AUTH_API_KEYS or AGW_AUTH_JWT_* (see docs/security.md), or set "
            "AGW_ALLOW_UNAUTHENTICATED=true if another layer authenticates callers"
        )


def tls_material(settings: Settings) -> tuple[bytes, bytes] | None:
    """The PEM certificate chain and key to serve TLS with, when configured."""
    if settings.tls_cert_file is None and settings.tls_key_file is None:
        return None
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        raise ValueError("TLS needs both AGW_TLS_CERT_FILE and AGW_TLS_KEY_FILE")
    return settings.tls_cert_file.read_bytes(), settings.tls_key_file.read_bytes()


def server_ssl_context(cert_chain: bytes, key: bytes) -> ssl.SSLContext:
    """A TLS server context (TLS 1.2 or newer) for the HTTP adapter."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory() as folder:  # the ssl module loads PEM from files
        cert_file, key_file = Path(folder, "cert.pem"), Path(folder, "key.pem")
        cert_file.write_bytes(cert_chain)
        key_file.touch(mode=0o600)
        key_file.write_bytes(key)
        context.load_cert_chain(cert_file, key_file)
    return context


def local_channel_security(
    cert_chain: bytes,
) -> tuple[grpc.ChannelCredentials, tuple[tuple[str, Any], ...]]:
    """How this process's HTTP adapter reaches its own TLS gRPC server on loopback.

    The certificate is trusted as its own root, and the name checked is one the
    certificate was issued for (its first DNS name, else its common name).
    """
    certificate = x509.load_pem_x509_certificate(cert_chain)
    names: list[str] = []
    try:
        extension = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        names = extension.value.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        pass
    if not names:
        common = certificate.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
        names = [str(common[0].value)] if common else ["localhost"]
    credentials = grpc.ssl_channel_credentials(root_certificates=cert_chain)
    return credentials, (("grpc.ssl_target_name_override", names[0]),)
