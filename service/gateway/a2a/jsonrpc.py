"""JSON-RPC 2.0 as A2A uses it: the request envelope, the error codes, the answers.

A request is one JSON object `{"jsonrpc": "2.0", "id": ..., "method": ...,
"params": {...}}`; batches are refused. Errors carry the JSON-RPC codes
(-32700 parse error, -32600 invalid request, -32601 method not found, -32602
invalid params, -32603 internal) and A2A's own (-32001 task not found, -32002
task not cancelable, ...). When the service gave a reason, the error's `data` is
a list holding a `google.rpc.ErrorInfo` (domain `agw.v1`), as A2A 1.0 clients
read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc
import orjson

from service.gateway.status import error_info, shown

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
TASK_NOT_FOUND = -32001
TASK_NOT_CANCELABLE = -32002
PUSH_NOT_SUPPORTED = -32003
UNSUPPORTED_OPERATION = -32004
CONTENT_TYPE_NOT_SUPPORTED = -32005
EXTENDED_CARD_NOT_CONFIGURED = -32007
VERSION_NOT_SUPPORTED = -32009

ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"
DOMAIN = "agw.v1"

RequestId = str | int | None


class RpcError(Exception):
    """Answer the request with this JSON-RPC error (and HTTP status)."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str = "",
        metadata: dict[str, str] | None = None,
        http_status: int = 200,
        request_id: RequestId = None,
    ) -> None:
        super().__init__(message)
        self.request_id = request_id  # when known: the request's own id
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata = metadata or {}
        self.http_status = http_status

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.reason:
            info: dict[str, Any] = {
                "@type": ERROR_INFO_TYPE,
                "reason": self.reason,
                "domain": DOMAIN,
            }
            if self.metadata:
                info["metadata"] = self.metadata
            error["data"] = [info]
        return error


@dataclass(frozen=True, slots=True)
class Request:
    """A well-formed JSON-RPC request."""

    id: RequestId
    method: str
    params: dict[str, Any] = field(default_factory=dict)


def parse(body: bytes) -> Request:
    """The request in `body`, or `RpcError` (-32700, -32600, -32602) saying what is wrong."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise RpcError(PARSE_ERROR, f"invalid JSON: {error}") from None
    if isinstance(data, list):
        raise RpcError(INVALID_REQUEST, "batch requests are not supported")
    if not isinstance(data, dict):
        raise RpcError(INVALID_REQUEST, "a request must be a JSON object")
    request_id = request_id_of(data)
    if data.get("id") is not None and request_id is None:
        raise _invalid(None, "'id' must be a string, an integer or null")
    if data.get("jsonrpc") != "2.0":
        raise _invalid(request_id, "'jsonrpc' must be exactly \"2.0\"")
    method = data.get("method")
    if not isinstance(method, str) or not method:
        raise _invalid(request_id, "'method' must be a non-empty string")
    params = data.get("params", {})
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, "'params' must be an object", request_id=request_id)
    return Request(request_id, method, params)


def request_id_of(data: dict[str, Any]) -> RequestId:
    """The request's id when it is a usable one (string or integer), else None."""
    value = data.get("id")
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    return value


def _invalid(request_id: RequestId, message: str) -> RpcError:
    return RpcError(INVALID_REQUEST, f"invalid request: {message}", request_id=request_id)


def result(request_id: RequestId, value: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


def failure(error: RpcError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": error.request_id, "error": error.body()}


def params_error(message: str) -> RpcError:
    return RpcError(INVALID_PARAMS, message)


#: gRPC status → JSON-RPC code, for failures of the service's calls.
_CODE_OF_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: INVALID_PARAMS,
    grpc.StatusCode.FAILED_PRECONDITION: INVALID_PARAMS,
    grpc.StatusCode.OUT_OF_RANGE: INVALID_PARAMS,
    grpc.StatusCode.NOT_FOUND: INVALID_PARAMS,
    grpc.StatusCode.UNIMPLEMENTED: UNSUPPORTED_OPERATION,
    grpc.StatusCode.UNAUTHENTICATED: INVALID_REQUEST,
}


def from_status(error: grpc.aio.AioRpcError) -> RpcError:
    """A failed call of the service as a JSON-RPC error, its reason kept.

    An unknown run is A2A's "task not found"; a refusal of the request's content
    is "invalid params"; a missing credential is "invalid request" with HTTP 401;
    anything else is an internal error carrying the service's reason.
    """
    code = error.code()
    reason, metadata = error_info(error)
    reason = reason or code.name
    rpc_code = TASK_NOT_FOUND if reason == "RUN_NOT_FOUND" else _CODE_OF_STATUS.get(code)
    message = shown(error.details() or code.name.lower(), 400)
    return RpcError(
        rpc_code if rpc_code is not None else INTERNAL_ERROR,
        message,
        reason=reason,
        metadata={**metadata, "status": code.name},
        http_status=401 if code == grpc.StatusCode.UNAUTHENTICATED else 200,
    )
