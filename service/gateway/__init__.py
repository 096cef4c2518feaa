"""The HTTP/SSE adapter: the gRPC service for browsers, driven by the proto's annotations.

Routes come from the `google.api.http` annotations of `agw.v1.AgentGateway`;
unary RPCs answer `{"code": 0, "msg": "success", "data": {...}}`, server-streaming
RPCs answer Server-Sent Events. The adapter calls the service over a gRPC channel,
in this process (`App`) or another (`python -m service.gateway`). It serves the
web page at `/` too.
"""

from service.gateway.server import HttpGateway, local_target

__all__ = ["HttpGateway", "local_target"]
