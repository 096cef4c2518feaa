"""TLS: gRPC and the HTTP adapter served over TLS with the configured certificate."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

import grpc
import httpx
import pytest
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from service.providers.loopback import LoopbackProvider
from service.testing import Harness, oneshot_agent, write_agent
from tests.core.tools.kit import answer_turn


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1, and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


async def test_grpc_and_http_are_served_over_tls(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    cert_file, key_file = self_signed(tmp_path)
    agents_dir = tmp_path / "agents"
    write_agent(agents_dir, "plain", oneshot_agent())
    settings = {"tls_cert_file": cert_file, "tls_key_file": key_file}
    async with Harness.start(agents_dir, provider, **settings) as gateway:
        port = gateway.app.grpc.port
        credentials = grpc.ssl_channel_credentials(root_certificates=cert_file.read_bytes())
        async with grpc.aio.secure_channel(f"localhost:{port}", credentials) as channel:
            stub = gateway_pb2_grpc.AgentGatewayStub(channel)
            agents = await stub.ListAgents(gw.ListAgentsRequest())
            assert [a.key for a in agents.agents] == ["plain"]
            provider.enqueue(answer_turn("over TLS"))
            request = gw.QueryRequest(agent_key="plain", message="hi")
            events = [e async for e in stub.Query(request)]
            assert events[-1].type == "run.complete"
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as plain:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await gateway_pb2_grpc.AgentGatewayStub(plain).ListAgents(
                    gw.ListAgentsRequest(), timeout=3
                )
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert gateway.app.http is not None
        url = f"https://localhost:{gateway.app.http.port}"
        trust = ssl.create_default_context(cafile=str(cert_file))
        async with httpx.AsyncClient(base_url=url, verify=trust) as http:
            response = await http.get("/api/agents")  # through the adapter's TLS hop to gRPC
            assert response.status_code == 200
            assert [a["key"] for a in response.json()["data"]["agents"]] == ["plain"]
        async with httpx.AsyncClient(base_url=url) as untrusting:
            with pytest.raises(httpx.ConnectError):
                await untrusting.get("/api/agents")


def test_tls_needs_both_files(tmp_path: Path) -> None:
    from service.assembly.config import Settings
    from service.assembly.security import tls_material

    cert_file, _ = self_signed(tmp_path)
    with pytest.raises(ValueError, match="both"):
        tls_material(Settings(tls_cert_file=cert_file))
    assert tls_material(Settings()) is None
