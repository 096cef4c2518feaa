"""HTTP-backed backend tools: a `.backend` entry with a `toolApi` URL, run by an HTTP call.

    {"tools": [{"name": "weather_api", "description": "...", "parameters": {...},
                "toolApi": "https://api.example.com/v1/weather",
                "toolParams": {"method": "POST",
                               "headers": {"Authorization": "Bearer ${ENV:WEATHER_KEY}"},
                               "maxResponseBytes": 65536, "title": "Weather", "icon": "emoji:🌦️"},
                "timeoutMs": 5000}]}

`HttpTools` is an executing source defined by the tool files: it reads the
backend entries of the tool files source that have a `toolApi`, and runs each
call by sending the arguments as a JSON body (`POST`, the default) or as query
parameters (`GET`). A JSON response (by its content type, or text that parses
as JSON) is the result as parsed; any other response is the result as text.
The tool files source, read after it, describes the same entries, so the
`.backend` rule (a backend entry describes a tool that a source executes) holds.

`toolParams`: `method` (`POST` or `GET`), `headers`, `maxResponseBytes` (default
256 KiB), and `title` and `icon` for the tool's `source.snapshot`. The time-out
is the entry's `timeoutMs` (else the service's tool time-out). `toolApi` and
header values may hold `${ENV:NAME}` references, resolved at each call.

Failures are the call's error result, bounded: a time-out (the executor's), a
response over the size limit, a non-2xx status (with the start of its body), a
redirect (not followed: it could carry the headers elsewhere), a connection
error. Resolved secrets are masked by value in every message and result, and
only the URL without query or user info is ever shown or logged. Calls go
straight to the endpoint: proxy settings of the environment are not used.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.core.tools.definitions import ToolDefinition, ToolError, ToolOrigin
from service.core.tools.sources import ToolCallInfo, ToolHandler, ToolSource
from service.toolsources.references import Expanded, MissingVariable, public_url

log = logging.getLogger("agw.tools.http")

DEFAULT_MAX_RESPONSE_BYTES = 256 * 1024
ERROR_BODY_CHARS = 300
READ_CHUNK_BYTES = 64 * 1024


class _Params(BaseModel):
    """The `toolParams` of an HTTP tool."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    method: Literal["GET", "POST"] = "POST"
    headers: dict[str, str] = Field(default_factory=dict)
    max_response_bytes: int = Field(DEFAULT_MAX_RESPONSE_BYTES, gt=0, alias="maxResponseBytes")
    title: str = ""
    icon: str = ""


@dataclass(frozen=True, slots=True)
class HttpTool:
    """One HTTP tool: its definition and how to call it."""

    definition: ToolDefinition
    url: str  # as written, references unresolved
    method: Literal["GET", "POST"]
    headers: Mapping[str, str]
    max_response_bytes: int


class HttpTools:
    """The `.backend` entries of a tool files source that call an HTTP endpoint."""

    name = "HTTP tools"
    executes = True

    def __init__(
        self,
        files: ToolSource,
        *,
        environ: Mapping[str, str],
        user_agent: str = "agw",
    ) -> None:
        self.files = files
        self.environ = environ
        self.user_agent = user_agent
        self._seen = -1
        self._tools: dict[str, HttpTool] = {}
        self._errors: dict[str, str] = {}
        self._session: aiohttp.ClientSession | None = None

    @property
    def version(self) -> int:
        return self.files.version

    @property
    def errors(self) -> Mapping[str, str]:
        self._follow()
        return self._errors

    def definitions(self) -> Mapping[str, ToolDefinition]:
        self._follow()
        return {name: tool.definition for name, tool in self._tools.items()}

    def handler(self, name: str) -> ToolHandler | None:
        self._follow()
        tool = self._tools.get(name)
        if tool is None:
            return None

        async def run(arguments: dict[str, Any], call: ToolCallInfo) -> Any:
            return await self.call(tool, arguments)

        return run

    async def aclose(self) -> None:
        """Close the HTTP client (calls after this open a new one)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- the tools of the files ----------------------------------------------------------

    def _follow(self) -> None:
        """Read the files' entries again if they changed since the last look."""
        version = self.files.version
        if version == self._seen:
            return
        self._seen = version
        tools: dict[str, HttpTool] = {}
        issues: dict[str, list[str]] = {}
        for name, definition in self.files.definitions().items():
            if definition.kind != "backend" or not definition.tool_api:
                continue
            try:
                tools[name] = http_tool(definition)
            except ValueError as exc:
                issues.setdefault(definition.source, []).append(f"'{name}': {exc}")
        self._tools = tools
        self._errors = {file: f"{file}: {'; '.join(found)}" for file, found in issues.items()}
        for text in self._errors.values():
            log.warning("HTTP tools not loaded: %s", text)

    # -- calling -------------------------------------------------------------------------

    async def call(self, tool: HttpTool, arguments: dict[str, Any]) -> Any:
        """Call `tool`'s endpoint with `arguments`; its result, or `ToolError`."""
        name, shown = tool.definition.name, public_url(tool.url)
        expanded = Expanded(self.environ)
        try:
            url = expanded.text(tool.url)
            headers = expanded.mapping(tool.headers)
        except MissingVariable as missing:
            raise ToolError(f"'{name}' is not configured: {missing}") from None
        secret = expanded.mask()
        headers = {"User-Agent": self.user_agent, "Accept": "application/json, text/*", **headers}
        request: dict[str, Any] = {"headers": headers, "allow_redirects": False}
        if tool.method == "GET":
            request["params"] = query_params(arguments)
        else:
            request["json"] = arguments
        try:
            async with self._client().request(tool.method, url, **request) as response:
                body = await _read(response, tool.max_response_bytes, shown)
                status, content_type = response.status, response.content_type
        except aiohttp.ClientError as exc:
            reason = _bounded(secret(f"{type(exc).__name__}: {exc}"))
            log.info("HTTP tool %s: %s %s failed: %s", name, tool.method, shown, reason)
            raise ToolError(f"{tool.method} {shown} failed: {reason}") from None
        text = secret(body.decode("utf-8", errors="replace"))
        log.debug("HTTP tool %s: %s %s -> %d", name, tool.method, shown, status)
        if 300 <= status < 400:
            raise ToolError(f"HTTP {status} from {shown}: redirects are not followed")
        if not 200 <= status < 300:
            excerpt = _bounded(text)
            raise ToolError(f"HTTP {status} from {shown}" + (f": {excerpt}" if excerpt else ""))
        return _result(text, content_type)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(trust_env=False)
        return self._session


def http_tool(definition: ToolDefinition) -> HttpTool:
    """The HTTP tool a backend entry with a `toolApi` describes; ValueError says what is wrong."""
    url = definition.tool_api
    if not url.lower().startswith(("http://", "https://")):
        raise ValueError(f"toolApi: must be an http:// or https:// URL (got {public_url(url)!r})")
    try:
        params = _Params.model_validate(dict(definition.tool_params or {}))
    except ValidationError as exc:
        issues = []
        for item in exc.errors(include_url=False):
            where = ".".join(str(part) for part in item["loc"])
            reason = "unknown key" if item["type"] == "extra_forbidden" else item["msg"]
            issues.append(f"toolParams.{where}: {reason}")
        raise ValueError("; ".join(issues)) from None
    origin = ToolOrigin(
        source_id=f"http:{definition.name}",
        title=params.title or definition.name,
        url=public_url(url),
        icon=params.icon,
    )
    return HttpTool(
        replace(definition, origin=origin),
        url,
        params.method,
        params.headers,
        params.max_response_bytes,
    )


def query_params(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    """`arguments` as query parameters: scalars as text, lists repeated, objects as JSON."""
    out: list[tuple[str, str]] = []
    for key, value in arguments.items():
        for item in value if isinstance(value, list) else [value]:
            out.append((key, _query_value(item)))
    return out


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, str | int | float):
        return str(value)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


async def _read(response: aiohttp.ClientResponse, limit: int, shown: str) -> bytes:
    """The response body, or `ToolError` once it is over `limit` bytes."""
    declared = response.content_length
    if declared is not None and declared > limit:
        raise ToolError(f"the response of {shown} is {declared} bytes; the limit is {limit}")
    body = bytearray()
    async for chunk in response.content.iter_chunked(READ_CHUNK_BYTES):
        body += chunk
        if len(body) > limit:
            raise ToolError(f"the response of {shown} is over {limit} bytes")
    return bytes(body)


def _result(text: str, content_type: str) -> Any:
    """A response body as the tool's result: parsed JSON when it is JSON, else the text."""
    if "json" in content_type or text.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def _bounded(text: str) -> str:
    """`text` on one line, at most `ERROR_BODY_CHARS` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= ERROR_BODY_CHARS else flat[:ERROR_BODY_CHARS] + "…"
