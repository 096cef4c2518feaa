"""HTTP routes read from the `google.api.http` annotations of a gRPC service descriptor.

Every method with an annotation gets a route (and one per `additional_bindings`
entry); nothing here names a particular RPC. A path template such as
`/api/runs/{run_id}/events` becomes an aiohttp path with one variable per field
path; `{name=*}`, `{name=**}` and `{name=prefix/*}` are understood too. Client-
and bidi-streaming methods have no HTTP mapping and are skipped.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from google.api import annotations_pb2, http_pb2  # type: ignore[import-untyped]
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message

log = logging.getLogger("agw.http")

_VARIABLE = re.compile(r"\{([A-Za-z_][\w.]*)(?:=([^}]*))?\}")


@dataclass(frozen=True, slots=True)
class Route:
    """One HTTP binding of one RPC."""

    method: MethodDescriptor
    http_method: str  # "GET", "POST", ... (upper case)
    path: str  # aiohttp path pattern, e.g. "/api/runs/{v0}/events"
    template: str  # the annotation's template, e.g. "/api/runs/{run_id}/events"
    variables: tuple[tuple[str, str], ...]  # (aiohttp variable, request field path)
    body: str  # "" (no body), "*" (whole request) or a field path
    response_body: str  # "" (whole response) or a field path

    @property
    def full_method(self) -> str:
        """The gRPC method path, e.g. "/agw.v1.AgentGateway/Query"."""
        return f"/{self.method.containing_service.full_name}/{self.method.name}"

    @property
    def streaming(self) -> bool:
        return self.method.server_streaming

    @property
    def request_class(self) -> type[Message]:
        return message_factory.GetMessageClass(self.method.input_type)

    @property
    def response_class(self) -> type[Message]:
        return message_factory.GetMessageClass(self.method.output_type)


def routes_of(*services: ServiceDescriptor) -> list[Route]:
    """The routes of every annotated, HTTP-mappable method of `services`."""
    routes: list[Route] = []
    for service in services:
        for method in service.methods:
            options = method.GetOptions()
            if not options.HasExtension(annotations_pb2.http):
                continue
            if method.client_streaming:
                log.warning("%s: client streaming has no HTTP mapping; skipped", method.full_name)
                continue
            rule = options.Extensions[annotations_pb2.http]
            for binding in (rule, *rule.additional_bindings):
                routes.append(_route(method, binding))
    return routes


def _route(method: MethodDescriptor, rule: http_pb2.HttpRule) -> Route:
    pattern = rule.WhichOneof("pattern")
    if pattern is None:
        raise ValueError(f"{method.full_name}: google.api.http without a pattern")
    if pattern == "custom":
        http_method, template = rule.custom.kind.upper(), rule.custom.path
    else:
        http_method, template = pattern.upper(), getattr(rule, pattern)
    path, variables = compile_template(template)
    return Route(method, http_method, path, template, variables, rule.body, rule.response_body)


def compile_template(template: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """An annotation path template as an aiohttp pattern and its (variable, field path) pairs."""
    if not template.startswith("/"):
        raise ValueError(f"path template must start with '/': {template!r}")
    variables: list[tuple[str, str]] = []
    out: list[str] = []
    position = 0
    wildcards = [0]
    for match in _VARIABLE.finditer(template):
        out.append(_literal(template[position : match.start()], wildcards))
        name = f"v{len(variables)}"
        variables.append((name, match.group(1)))
        out.append(f"{{{name}:{_segments_regex(match.group(2) or '*')}}}")
        position = match.end()
    out.append(_literal(template[position:], wildcards))
    return "".join(out), tuple(variables)


def _segments_regex(segments: str) -> str:
    parts = []
    for segment in segments.split("/"):
        if segment == "**":
            parts.append(".+")
        elif segment == "*":
            parts.append("[^/]+?")
        else:
            parts.append(re.escape(segment))
    return "/".join(parts)


def _literal(text: str, wildcards: list[int]) -> str:
    """Literal path text; a bare `*` segment matches any one segment (its value is unused)."""
    parts = text.split("/")
    for index, part in enumerate(parts):
        if part == "*":
            parts[index] = f"{{w{wildcards[0]}:[^/]+}}"
            wildcards[0] += 1
    return "/".join(parts)
