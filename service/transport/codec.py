"""The one mapping between the contract's requests and enums and the core's commands.

Requests are decoded into core commands here, at the edge, and the core's
answers encoded into responses; every enum table between the two lives here.
Free-form JSON fields (`params`, `scene`, a submitted payload) become plain
JSON values; a value JSON cannot carry (NaN, infinity) is refused as
`InvalidRequest` before anything is started.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from google.protobuf import json_format, struct_pb2

from service.core.agents.definition import AgentDefinition
from service.core.agents.schema import Mode
from service.core.agents.store import AgentChange, StoredAgent
from service.core.commands import (
    ChatView,
    DebugLevel,
    QueryCommand,
    Reference,
    Strategy,
    SubmitCommand,
    SubmitOutcome,
    SubmitResult,
    UploadCommand,
)
from service.core.errors import InvalidRequest
from service.core.files import WorkspaceFile
from service.core.ids import ANONYMOUS, Principal
from service.core.values import ChatSummary, LiveRun, SpendEntry, StoredUpload
from service.core.webhooks import Format as WebhookFormat
from service.core.webhooks import Webhook

STRATEGIES: dict[int, Strategy] = {
    gw.MULTITASK_STRATEGY_REJECT: "reject",
    gw.MULTITASK_STRATEGY_ENQUEUE: "enqueue",
    gw.MULTITASK_STRATEGY_INTERRUPT: "interrupt",
}

DEBUG_LEVELS: dict[int, DebugLevel] = {
    gw.DEBUG_LEVEL_OFF: DebugLevel.OFF,
    gw.DEBUG_LEVEL_BASIC: DebugLevel.BASIC,
    gw.DEBUG_LEVEL_STANDARD: DebugLevel.STANDARD,
    gw.DEBUG_LEVEL_FULL: DebugLevel.FULL,
}

SUBMIT_OUTCOMES: dict[SubmitOutcome, gw.SubmitOutcome.ValueType] = {
    "ACCEPTED": gw.SUBMIT_OUTCOME_ACCEPTED,
    "UNKNOWN_RUN": gw.SUBMIT_OUTCOME_UNKNOWN_RUN,
    "UNKNOWN_TOOL": gw.SUBMIT_OUTCOME_UNKNOWN_TOOL,
    "ALREADY_ANSWERED": gw.SUBMIT_OUTCOME_ALREADY_ANSWERED,
    "EXPIRED": gw.SUBMIT_OUTCOME_EXPIRED,
}

MODES: dict[Mode, gw.AgentMode.ValueType] = {
    "ONESHOT": gw.AGENT_MODE_ONESHOT,
    "REACT": gw.AGENT_MODE_REACT,
    "PLAN_EXECUTE": gw.AGENT_MODE_PLAN_EXECUTE,
}
MODE_NAMES: dict[int, Mode] = {value: name for name, value in MODES.items()}


# Requests -> commands -------------------------------------------------------------------


def _finite(value: Any, name: str) -> Any:
    """`value`, refused when it holds a number JSON cannot carry (NaN, ±infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidRequest(f"{name} holds a number JSON cannot carry ({value})")
    if isinstance(value, dict):
        for item in value.values():
            _finite(item, name)
    elif isinstance(value, list):
        for item in value:
            _finite(item, name)
    return value


def _whole(value: Any) -> Any:
    """`value` with its integral numbers as ints: a `Value` holds every number as a double,
    so the 1 a client sent arrives as 1.0 (and would reach a tool or a model so)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    if isinstance(value, dict):
        return {key: _whole(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole(item) for item in value]
    return value


def _to_json(message: Any, name: str) -> Any:
    try:
        return _whole(_finite(json_format.MessageToDict(message), name))
    except ValueError as error:  # NaN or infinity in a number_value
        raise InvalidRequest(f"{name} holds a value JSON cannot carry ({error})") from None


def struct_value(message: struct_pb2.Struct, name: str) -> dict[str, Any]:
    """A `Struct` field as a JSON object."""
    return dict(_to_json(message, name))


def json_value(message: struct_pb2.Value, name: str) -> Any:
    """A `Value` field as JSON data (an unset value is null)."""
    if message.WhichOneof("kind") is None:
        return None
    return _to_json(message, name)


def query_command(request: gw.QueryRequest, principal: Principal = ANONYMOUS) -> QueryCommand:
    strategy = STRATEGIES.get(request.multitask_strategy)
    if request.multitask_strategy and strategy is None:
        raise InvalidRequest(f"unknown multitaskStrategy {request.multitask_strategy}")
    debug_level = DEBUG_LEVELS.get(request.debug_level)
    if request.debug_level and debug_level is None:
        raise InvalidRequest(f"unknown debugLevel {request.debug_level}")
    mode = MODE_NAMES.get(request.mode)
    if request.mode and mode is None:
        raise InvalidRequest(f"unknown mode {request.mode}")
    return QueryCommand(
        agent_key=request.agent_key,
        message=request.message,
        chat_id=request.chat_id,
        request_id=request.request_id,
        role=request.role or "user",
        references=tuple(
            Reference(
                id=r.id,
                type=r.type,
                name=r.name,
                url=r.url,
                mime_type=r.mime_type,
                size_bytes=r.size_bytes,
                sha256=r.sha256,
            )
            for r in request.references
        ),
        params=struct_value(request.params, "params") if request.HasField("params") else None,
        scene=struct_value(request.scene, "scene") if request.HasField("scene") else None,
        stream=request.stream if request.HasField("stream") else True,
        debug_level=debug_level,
        strategy=strategy,
        principal=principal,
        mode=mode,
        overrides=overrides_of(request.overrides) if request.HasField("overrides") else None,
        tools=tuple(
            {
                "name": tool.name,
                "description": tool.description,
                **(
                    {"parameters": struct_value(tool.parameters, "tools.parameters")}
                    if tool.HasField("parameters")
                    else {}
                ),
            }
            for tool in request.tools
        ),
    )


#: The agent file's name of each override a `RunOverrides` field sets.
OVERRIDE_NAMES = {
    "model": "model",
    "provider_key": "providerKey",
    "temperature": "temperature",
    "top_p": "top_p",
    "max_tokens": "max_tokens",
    "reasoning_enabled": "reasoning.enabled",
    "reasoning_effort": "reasoning.effort",
    "max_model_calls": "budget.maxModelCalls",
    "max_tool_calls": "budget.maxToolCalls",
    "max_steps": "budget.maxSteps",
    "timeout_ms": "budget.timeoutMs",
}


def overrides_of(message: gw.RunOverrides) -> dict[str, Any]:
    """The overrides a query sets, by the agent file's names (NaN and infinity refused)."""
    overrides = {OVERRIDE_NAMES[f.name]: value for f, value in message.ListFields()}
    return dict(_finite(overrides, "overrides"))


#: The wire value of each webhook format, and back.
WEBHOOK_FORMATS: dict[WebhookFormat, gw.WebhookFormat.ValueType] = {
    "agw": gw.WEBHOOK_FORMAT_AGW,
    "a2a": gw.WEBHOOK_FORMAT_A2A,
    "a2a_v03": gw.WEBHOOK_FORMAT_A2A_V03,
}
WEBHOOK_FORMAT_NAMES: dict[int, WebhookFormat] = {
    gw.WEBHOOK_FORMAT_UNSPECIFIED: "agw",
    **{int(value): name for name, value in WEBHOOK_FORMATS.items()},
}


def webhook_of(message: gw.Webhook, webhook_id: str = "") -> Webhook:
    """A webhook a request gives (checked by the front door)."""
    format_name = WEBHOOK_FORMAT_NAMES.get(message.format)
    if format_name is None:
        raise InvalidRequest(f"unknown webhook format {message.format}")
    return Webhook(
        url=message.url,
        format=format_name,
        secret=message.secret,
        token=message.token,
        authorization=message.authorization,
        webhook_id=webhook_id,
    )


def run_webhook(webhook: Webhook) -> gw.RunWebhook:
    """A run's webhook as the API shows it: never its secret or its authorization."""
    return gw.RunWebhook(
        webhook_id=webhook.webhook_id,
        run_id=webhook.run_id,
        url=webhook.url,
        format=WEBHOOK_FORMATS[webhook.format],
        token=webhook.token,
        authorized=bool(webhook.authorization),
        created_at=webhook.created_at_ms,
    )


def wait_response(
    terminal: pb.Event | None, last: pb.Event | None, live: LiveRun | None
) -> gw.WaitResponse:
    status = gw.RUN_STATUS_ENDED if terminal is not None else gw.RUN_STATUS_RUNNING
    if live is not None and live.waits:
        status = gw.RUN_STATUS_WAITING
    response = gw.WaitResponse(
        status=status,
        last_seq=last.seq if last is not None else 0,
        chat_id=last.chat_id if last is not None else "",
    )
    if terminal is not None:
        response.terminal.CopyFrom(terminal)
    if live is not None:
        response.waits.extend(pending_waits(live))
    return response


def pending_waits(live: LiveRun) -> list[gw.PendingWait]:
    """What a live run waits for, as the contract says it."""
    return [
        gw.PendingWait(tool_id=w.tool_id, kind=WAIT_KIND[w.kind], tool_name=w.tool_name)
        for w in live.waits
    ]


def submit_command(request: gw.SubmitRequest, principal: Principal = ANONYMOUS) -> SubmitCommand:
    return SubmitCommand(
        run_id=request.run_id,
        tool_id=request.tool_id,
        payload=json_value(request.payload, "payload"),
        chat_id=request.chat_id,
        request_id=request.request_id,
        view_id=request.view_id,
        principal=principal,
    )


def upload_command(request: gw.UploadRequest, principal: Principal = ANONYMOUS) -> UploadCommand:
    return UploadCommand(
        name=request.name,
        content=request.content,
        mime_type=request.mime_type,
        chat_id=request.chat_id,
        request_id=request.request_id,
        principal=principal,
    )


# Answers -> responses -------------------------------------------------------------------


def submit_response(result: SubmitResult) -> gw.SubmitResponse:
    return gw.SubmitResponse(
        accepted=result.accepted, outcome=SUBMIT_OUTCOMES[result.outcome], detail=result.detail
    )


AGENT_CHANGES: dict[AgentChange, gw.AgentChange.ValueType] = {
    "created": gw.AGENT_CHANGE_CREATED,
    "updated": gw.AGENT_CHANGE_UPDATED,
    "rolled_back": gw.AGENT_CHANGE_ROLLED_BACK,
    "seeded": gw.AGENT_CHANGE_SEEDED,
}


def agent_version(stored: StoredAgent) -> gw.AgentVersion:
    definition = struct_pb2.Struct()
    json_format.ParseDict(stored.definition, definition)
    return gw.AgentVersion(
        agent_key=stored.key,
        version=stored.version,
        definition=definition,
        created_at=stored.created_at,
        created_by=stored.created_by,
        change=AGENT_CHANGES[stored.change],
        source_version=stored.source_version,
        comment=stored.comment,
    )


def definition_of(request: gw.CreateAgentRequest | gw.UpdateAgentRequest) -> dict[str, Any] | None:
    """The request's definition given as JSON (None: not given)."""
    return (
        struct_value(request.definition, "definition") if request.HasField("definition") else None
    )


def agent_message(agent: AgentDefinition, version: int = 0) -> gw.Agent:
    model = agent.model_config_
    return gw.Agent(
        key=agent.key,
        name=agent.name or agent.key,
        icon=agent.icon or "",
        description=agent.description or "",
        mode=MODES[agent.mode],
        provider_key=model.provider_key or "" if model else "",
        model=model.model or "" if model else "",
        tools=agent.tool_names(),
        modes=[MODES[mode] for mode in agent.allowed_modes],
        examples=agent.examples,
        version=version,
    )


def agent_response(agent: AgentDefinition, version: int = 0) -> gw.GetAgentResponse:
    definition = struct_pb2.Struct()
    json_format.ParseDict(agent.to_json_dict(), definition)
    return gw.GetAgentResponse(agent=agent_message(agent, version), definition=definition)


def chat_summary(summary: ChatSummary) -> gw.ChatSummary:
    return gw.ChatSummary(
        chat_id=summary.chat_id,
        chat_name=summary.chat_name,
        agent_key=summary.agent_key,
        created_at=summary.created_at,
        updated_at=summary.updated_at,
        run_count=summary.run_count,
    )


def chat_response(view: ChatView, *, include_raw_messages: bool) -> gw.GetChatResponse:
    response = gw.GetChatResponse(
        chat_id=view.chat_id, chat_name=view.chat_name, events=view.events
    )
    for ref in view.references:
        json_format.ParseDict(ref, response.references.add(), ignore_unknown_fields=True)
    if include_raw_messages:
        for record in view.records:
            response.raw_messages.add().update(record)
    live = view.live_run
    if live is not None:
        response.live_run.CopyFrom(
            gw.LiveRun(
                run_id=live.run_id,
                agent_key=live.agent_key,
                last_seq=live.last_seq,
                waits=pending_waits(live),
            )
        )
    return response


def spend_row(entry: SpendEntry) -> gw.SpendRow:
    return gw.SpendRow(
        day=entry.day,
        tenant=entry.tenant,
        api_key=entry.key,
        agent_key=entry.agent_key,
        model=entry.model,
        calls=entry.calls,
        prompt_tokens=entry.prompt_tokens,
        completion_tokens=entry.completion_tokens,
        cost=entry.cost,
    )


#: The wire value of each kind of wait.
WAIT_KIND = {
    "frontend_tool": gw.WAIT_KIND_FRONTEND_TOOL,
    "question": gw.WAIT_KIND_QUESTION,
    "permission": gw.WAIT_KIND_PERMISSION,
    "plan_approval": gw.WAIT_KIND_PLAN_APPROVAL,
}


def workspace_file(file: WorkspaceFile) -> gw.WorkspaceFile:
    return gw.WorkspaceFile(
        path=file.path,
        size_bytes=file.size_bytes,
        mime_type=file.mime_type,
        modified_at=file.modified_at_ms,
    )


def upload_response(upload: StoredUpload, command: UploadCommand) -> gw.UploadResponse:
    """The stored file as a reference, and its `request.upload` event."""
    reference = pb.Reference(
        id=upload.id,
        type=upload.type,
        name=upload.name,
        mime_type=upload.mime_type,
        size_bytes=upload.size_bytes,
        sha256=upload.sha256,
    )
    event = pb.Event(
        seq=1,
        type="request.upload",
        timestamp=time.time_ns() // 1_000_000,
        chat_id=command.chat_id,
        request_upload=pb.RequestUpload(
            request_id=command.request_id or str(uuid.uuid4()),
            upload=pb.UploadInfo(
                type=upload.type,
                name=upload.name,
                size_bytes=upload.size_bytes,
                mime_type=upload.mime_type,
                sha256=upload.sha256,
            ),
            reference_id=upload.id,
        ),
    )
    return gw.UploadResponse(reference=reference, event=event)
