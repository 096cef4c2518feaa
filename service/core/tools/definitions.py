"""Tool definitions: the three kinds of tool, the files that declare them, their model schema.

A tool file holds `{"tools": [...]}`; its suffix sets the kind of every tool in it:

| suffix                      | kind     | what the service does with a call               |
|-----------------------------|----------|-------------------------------------------------|
| `.backend`                  | backend  | executes it and feeds the result to the model   |
| `.action`                   | action   | tells the client (`action.*`), answers `"OK"`   |
| `.html` / `.qlc` / `.dqlc`  | frontend | lets the client render it, waits for `Submit`   |

One entry: `name` (letters, digits, `_`, `-`), `description` (sent to the model),
`parameters` (a JSON Schema object, default: no parameters), and optionally
`after_call_hint` (added to the system prompt of the stages that offer the tool),
`toolApi` and `toolParams`, and `timeoutMs` (backend tools: how long a call may
take) and `cacheable` (backend tools: an identical call within a run may be answered
with the earlier result, marked `cached`, instead of running again — declare it only
for tools without side effects whose result does not change within a run), and
`idempotent` (backend tools: running a call twice does no harm — a run that resumes
after its process stopped during the call runs it again; otherwise the call is answered
with an "interrupted" error the model sees; a cacheable tool is idempotent). A frontend
tool's `toolApi` and `toolParams` are passed to the client in `tool.start`; a backend
tool's configure the HTTP call that runs it (see service/toolsources/http.py) and stay
in the service. A frontend tool may also have `answerSchema` (the JSON Schema of the
answer it waits for) and `view` (an HTML file, relative to the tool file's directory and
inside it, e.g. `views/confirm_dialog.html`): both go to the client in `tool.start`, so a
page can render the view or build a form for the answer. A broken file is reported with
the file, the entry and the field.

A tool that comes from a source outside the service (an MCP server, an HTTP
endpoint) carries its `ToolOrigin`, which a run describes once with
`source.snapshot` when a turn first offers one of its tools.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from service.core.errors import InvalidRequest
from service.core.errors import ToolNotFound as ToolNotFound  # raised by the registry
from service.core.events import to_struct

ToolKind = Literal["backend", "frontend", "action"]

#: file suffix → (kind, client view type)
SUFFIXES: dict[str, tuple[ToolKind, str]] = {
    ".backend": ("backend", "backend"),
    ".action": ("action", "action"),
    ".html": ("frontend", "html"),
    ".qlc": ("frontend", "qlc"),
    ".dqlc": ("frontend", "dqlc"),
}
NO_PARAMETERS: Mapping[str, Any] = {"type": "object", "properties": {}}
MAX_VIEW_BYTES = 256 * 1024  # the largest view file a frontend tool may name


@dataclass(frozen=True, slots=True)
class ToolOrigin:
    """Where a tool runs when that is outside the service: an MCP server, an HTTP endpoint."""

    source_id: str  # e.g. "mcp:clock", "http:weather_api"
    title: str
    url: str = ""  # never with credentials: no user info, no query
    icon: str = ""  # a URL or "emoji:..."


class ToolError(Exception):
    """Raised by a tool implementation: its message becomes the call's error result."""


class ToolDefinitionError(InvalidRequest):
    """A tool file is invalid; `issues` name the entry, the field and why."""

    def __init__(self, issues: Sequence[str], source: str = "") -> None:
        text = "; ".join(issues)
        super().__init__(f"{source}: {text}" if source else text, file=source)
        self.issues = tuple(issues)
        self.source = source


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    """One tool, as the model and the client see it."""

    name: str
    kind: ToolKind
    description: str
    parameters: Mapping[str, Any] = field(default_factory=lambda: dict(NO_PARAMETERS))
    view_type: str = "backend"  # "backend", "action", or the frontend's "html"/"qlc"/"dqlc"
    after_call_hint: str = ""
    tool_api: str = ""
    tool_params: Mapping[str, Any] | None = None
    timeout_s: float | None = None
    cacheable: bool = False  # an identical call within a run may reuse the earlier result
    # Running a call twice does no harm: a resumed run runs a call it had begun again.
    idempotent: bool = False
    answer_schema: Mapping[str, Any] | None = None  # frontend: JSON Schema of the answer
    view_html: str = ""  # frontend: the HTML document of its view
    source: str = "built-in"  # the file that defines it
    origin: ToolOrigin | None = None  # the outside source that runs it, if any

    def schema(self) -> dict[str, Any]:
        """The OpenAI `tools[]` entry."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }

    def start_fields(self) -> dict[str, Any]:
        """The optional fields of this tool's `tool.start` event."""
        out: dict[str, Any] = {"description": self.description}
        if self.kind == "backend":  # its toolApi/toolParams configure its call, not the client
            return out
        if self.tool_api:
            out["tool_api"] = self.tool_api
        if self.tool_params:
            out["tool_params"] = to_struct(dict(self.tool_params))
        if self.answer_schema:
            out["answer_schema"] = to_struct(dict(self.answer_schema))
        if self.view_html:
            out["view_html"] = self.view_html
        return out


ToolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: ToolName
    description: str = Field(min_length=1)
    parameters: dict[str, Any] = Field(default_factory=lambda: dict(NO_PARAMETERS))
    after_call_hint: str = Field(
        "", validation_alias=AliasChoices("after_call_hint", "afterCallHint")
    )
    tool_api: str = Field("", validation_alias=AliasChoices("toolApi", "tool_api"))
    tool_params: dict[str, Any] | None = Field(
        None, validation_alias=AliasChoices("toolParams", "tool_params")
    )
    timeout_ms: int | None = Field(
        None, gt=0, validation_alias=AliasChoices("timeoutMs", "timeout_ms")
    )
    cacheable: bool = False
    idempotent: bool = False
    answer_schema: dict[str, Any] | None = Field(
        None, validation_alias=AliasChoices("answerSchema", "answer_schema")
    )
    view: str = ""


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    tools: list[dict[str, Any]]


def kind_of(path: Path) -> tuple[ToolKind, str] | None:
    """(kind, view type) of a tool file, from its suffix; None for other files."""
    return SUFFIXES.get(path.suffix.lower())


def load_tool_file(path: Path) -> tuple[ToolDefinition, ...]:
    """Read and validate one tool file."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolDefinitionError([f"not UTF-8 text ({exc})"], path.name) from exc
    return parse_tool_text(text, path.suffix, source=path.name, base=path.parent)


def parse_tool_text(
    text: str, suffix: str, *, source: str = "", base: Path | None = None
) -> tuple[ToolDefinition, ...]:
    """The tools of a file's text; `suffix` (e.g. ".backend") sets their kind.

    `base` is the directory that an entry's `view` is read from (none: views refused).
    """
    kind = SUFFIXES.get(suffix.lower())
    if kind is None:
        raise ToolDefinitionError([f"unknown tool file suffix {suffix!r}"], source)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolDefinitionError(
            [f"invalid JSON: {exc.msg} (at line {exc.lineno}, column {exc.colno})"], source
        ) from None
    try:
        entries = _File.model_validate(data).tools
    except ValidationError as exc:
        raise ToolDefinitionError(_issues(exc, ""), source) from None
    issues: list[str] = []
    tools: list[ToolDefinition] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(entries):
        where = f"tools[{index}]"
        try:
            entry = _Entry.model_validate(raw)
        except ValidationError as exc:
            issues += _issues(exc, where)
            continue
        problems = schema_issues(entry.parameters)
        issues += [f"{where}.parameters{p}" for p in problems]
        if entry.name in seen:
            first = seen[entry.name]
            issues.append(f"{where}.name: duplicate tool name '{entry.name}' (see tools[{first}])")
        seen.setdefault(entry.name, index)
        if kind[0] != "backend" and entry.timeout_ms is not None:
            issues.append(f"{where}.timeoutMs: only backend tools have a time-out")
        if kind[0] != "backend" and entry.cacheable:
            issues.append(f"{where}.cacheable: only backend tools may be cached")
        if kind[0] != "backend" and entry.idempotent:
            issues.append(f"{where}.idempotent: only backend tools run again when a run resumes")
        if kind[0] != "frontend" and (entry.view or entry.answer_schema is not None):
            issues.append(f"{where}: only frontend tools have a view or an answerSchema")
        if entry.answer_schema is not None and not isinstance(entry.answer_schema.get("type"), str):
            issues.append(f'{where}.answerSchema.type: must be a JSON Schema type, e.g. "object"')
        view_html = ""
        if entry.view and kind[0] == "frontend":
            try:
                view_html = _read_view(base, entry.view)
            except ValueError as exc:
                issues.append(f"{where}.view: {exc}")
        tools.append(
            ToolDefinition(
                name=entry.name,
                kind=kind[0],
                description=entry.description,
                parameters=entry.parameters,
                view_type=kind[1],
                after_call_hint=entry.after_call_hint.strip(),
                tool_api=entry.tool_api,
                tool_params=entry.tool_params,
                timeout_s=entry.timeout_ms / 1000 if entry.timeout_ms else None,
                cacheable=entry.cacheable,
                idempotent=entry.idempotent or entry.cacheable,
                answer_schema=entry.answer_schema,
                view_html=view_html,
                source=source or "text",
            )
        )
    if issues:
        raise ToolDefinitionError(issues, source)
    return tuple(tools)


#: The most tools a query may declare, and the largest JSON of one (its schema included).
MAX_CLIENT_TOOLS = 64
MAX_CLIENT_TOOL_BYTES = 64 * 1024
#: `tool.start`'s type of a tool the query declared (`QueryRequest.tools`).
CLIENT_VIEW_TYPE = "client"


class _ClientEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: ToolName
    description: str = Field(min_length=1)
    parameters: dict[str, Any] = Field(default_factory=lambda: dict(NO_PARAMETERS))


def client_tools(entries: Sequence[Mapping[str, Any]]) -> tuple[ToolDefinition, ...]:
    """The tools a query declares (`{name, description, parameters}` each), validated like a
    tool file's entries: frontend tools of type "client", answered by the client through
    Submit. `InvalidRequest` names each entry and field that is wrong."""
    if len(entries) > MAX_CLIENT_TOOLS:
        raise InvalidRequest(
            f"tools: {len(entries)} tools; a query may declare at most {MAX_CLIENT_TOOLS}"
        )
    issues: list[str] = []
    tools: list[ToolDefinition] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(entries):
        where = f"tools[{index}]"
        if len(json.dumps(raw, ensure_ascii=False, default=str)) > MAX_CLIENT_TOOL_BYTES:
            issues.append(f"{where}: larger than {MAX_CLIENT_TOOL_BYTES} bytes of JSON")
            continue
        try:
            entry = _ClientEntry.model_validate(dict(raw))
        except ValidationError as exc:
            issues += _issues(exc, where)
            continue
        issues += [f"{where}.parameters{p}" for p in schema_issues(entry.parameters)]
        if entry.name in seen:
            issues.append(
                f"{where}.name: duplicate tool name '{entry.name}' (see tools[{seen[entry.name]}])"
            )
        seen.setdefault(entry.name, index)
        tools.append(
            ToolDefinition(
                name=entry.name,
                kind="frontend",
                description=entry.description,
                parameters=entry.parameters,
                view_type=CLIENT_VIEW_TYPE,
                source="query",
            )
        )
    if issues:
        raise InvalidRequest("; ".join(issues))
    return tuple(tools)


def view_files(path: Path) -> frozenset[Path]:
    """The view files tool file `path` names (resolved; none when it cannot be read as
    JSON): the files whose change changes its tools, valid or not."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return frozenset()
    entries = data.get("tools") if isinstance(data, dict) else None
    names = [e.get("view") for e in entries or () if isinstance(e, dict)]
    base = path.parent.resolve()
    return frozenset((base / name).resolve() for name in names if isinstance(name, str) and name)


def _read_view(base: Path | None, name: str) -> str:
    """The HTML of view file `name` under `base`; ValueError says why it cannot be used."""
    if base is None:
        raise ValueError("views are read only from tool files in a directory")
    root = base.resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root) or path == root:
        raise ValueError(f"{name!r} is outside the tool file's directory")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {name!r} ({exc.strerror or exc})") from None
    if len(data) > MAX_VIEW_BYTES:
        raise ValueError(f"{name!r} is larger than {MAX_VIEW_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{name!r} is not UTF-8 text") from None


def schema_issues(schema: Mapping[str, Any]) -> list[str]:
    """What keeps `schema` from being a usable parameters schema (suffixes of a field path)."""
    issues: list[str] = []
    if schema.get("type", "object") != "object":
        issues.append(f'.type: must be "object" (got {json.dumps(schema.get("type"))})')
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        issues.append(".properties: must be an object")
        properties = {}
    for name, spec in properties.items():
        if not isinstance(spec, dict):
            issues.append(f".properties.{name}: must be a JSON Schema object")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        issues.append(".required: must be a list of property names")
    else:
        for position, name in enumerate(required):
            if name not in properties:
                issues.append(f".required[{position}]: '{name}' is not a property")
    return issues


def _issues(error: ValidationError, prefix: str) -> list[str]:
    out: list[str] = []
    for item in error.errors(include_url=False):
        path = prefix
        for part in item["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        if item["type"] == "missing":
            reason = "is required"
        elif item["type"] == "extra_forbidden":
            reason = "unknown key"
        else:
            reason = item["msg"]
        out.append(f"{path}: {reason}" if path else reason)
    return out
