"""The grpc.aio server: the gateway service, health, reflection, graceful stop."""

from __future__ import annotations

import logging
import os
import secrets

import grpc
from agw.v1 import gateway_pb2, gateway_pb2_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from service.core.frontdoor import FrontDoor
from service.transport.auth import Authenticator
from service.transport.guard import GatewayGuard
from service.transport.servicer import AgentGatewayServicer, ModelCatalog, no_models

log = logging.getLogger("agw.grpc")

SERVICE_NAME = gateway_pb2.DESCRIPTOR.services_by_name["AgentGateway"].full_name
STREAMS_END_S = 2.0  # at a stop, how long the streams still open may take to end


class GrpcServer:
    """The gateway's gRPC endpoint."""

    def __init__(
        self,
        front: FrontDoor,
        address: str,
        *,
        keepalive_time_s: float = 60.0,
        cancel_on_disconnect: bool = False,
        authenticator: Authenticator | None = None,
        max_concurrent_rpcs: int | None = None,
        tls: tuple[bytes, bytes] | None = None,
        heartbeat_s: float = 0.0,
        reuse_port: bool = False,
        models: ModelCatalog = no_models,
    ) -> None:
        """`tls`: the PEM certificate chain and private key to serve TLS with;
        `heartbeat_s`: a stream's silence after which it sends a heartbeat (0: never);
        `reuse_port`: bind with SO_REUSEPORT, so that several worker processes listen on
        one port and the kernel spreads connections over them (off: a second server on
        the port fails to bind instead of silently sharing it). A server sharing its port
        also listens on an abstract Unix socket of its own (`own_target`, without TLS),
        so that its process's HTTP adapter calls this server, not whichever worker the
        kernel would pick. `models` answers ListModels."""
        self.front = front
        self.address = address
        self.server = grpc.aio.server(
            interceptors=[GatewayGuard(authenticator or Authenticator())],
            # Past this many calls in flight, gRPC answers RESOURCE_EXHAUSTED at once
            # instead of queueing them (the front door refuses runs past its own limit).
            maximum_concurrent_rpcs=max_concurrent_rpcs,
            options=[
                ("grpc.keepalive_time_ms", int(keepalive_time_s * 1000)),
                ("grpc.keepalive_timeout_ms", 20_000),
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ("grpc.so_reuseport", 1 if reuse_port else 0),
            ],
        )
        self.servicer = servicer = AgentGatewayServicer(
            front,
            cancel_on_disconnect=cancel_on_disconnect,
            heartbeat_s=heartbeat_s,
            models=models,
        )
        gateway_pb2_grpc.add_AgentGatewayServicer_to_server(servicer, self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
        )
        if tls is not None:
            credentials = grpc.ssl_server_credentials([(tls[1], tls[0])])
            self.port = self.server.add_secure_port(address, credentials)
        else:
            self.port = self.server.add_insecure_port(address)
        if self.port == 0:
            raise OSError(f"cannot bind gRPC address {address}")
        self.own_target: str | None = None
        if reuse_port and tls is None:
            own = f"unix-abstract:agw-grpc-{os.getpid()}-{secrets.token_hex(4)}"
            if self.server.add_insecure_port(own) == 0:
                raise OSError(f"cannot bind gRPC address {own}")
            self.own_target = own

    async def start(self) -> None:
        await self.server.start()
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("gRPC listening on %s (port %d)", self.address, self.port)

    async def stop(self, grace_s: float, delay_s: float = 0.0) -> None:
        """Graceful stop: report NOT_SERVING (load balancers stop sending calls here; new
        queries are refused UNAVAILABLE), drain the runs (those another replica can take
        over are handed over after `delay_s`, the others get `grace_s`), end the streams of
        runs executed elsewhere (RUN_HANDED_OVER: their clients re-attach), then close."""
        await self.health.enter_graceful_shutdown()
        await self.front.drain(grace_s, delay_s)
        await self.servicer.end_streams(STREAMS_END_S)
        await self.server.stop(grace=STREAMS_END_S)
        log.info("gRPC server stopped")
