"""A notification as its webhook receives it: the JSON body, and the signed headers.

The `agw` form (a run ended):

    {"id": "whd_…", "type": "run.complete", "runId": "…", "chatId": "…", "agentKey": "…",
     "state": "completed", "event": {…the terminal event as the SSE API sends it…},
     "timestamp": 1732200000000}

The A2A forms, one per change of the run's task state: A2A 1.0 posts a `StreamResponse`,
`{"statusUpdate": {"taskId", "contextId", "status": {"state": "TASK_STATE_…", "timestamp"},
"metadata"}}`; A2A 0.3 posts the `Task`, `{"kind": "task", "id", "contextId", "status":
{"state": "working", "timestamp"}, "metadata"}`. The metadata names the agw event
(`agwType`) and, at the end, what the stream's last update says (finish reason and usage,
the error, the cancel's reason).

Signature (the Standard Webhooks scheme): `Webhook-Id` (the notification's id, the same on
every attempt), `Webhook-Timestamp` (Unix seconds of this attempt) and `Webhook-Signature:
v1,<base64 of HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`; the key is the secret's
UTF-8 bytes, or the base64-decoded rest of a secret written `whsec_…`. A webhook's own
token and authorization go in `X-A2A-Notification-Token` and `Authorization`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from datetime import UTC, datetime
from typing import Any

import orjson
from agw.v1 import events_pb2 as pb

from service.core.webhooks import Delivery
from service.gateway import codec

#: A task state in A2A 1.0's names.
STATES_V1 = {
    "working": "TASK_STATE_WORKING",
    "input-required": "TASK_STATE_INPUT_REQUIRED",
    "completed": "TASK_STATE_COMPLETED",
    "failed": "TASK_STATE_FAILED",
    "canceled": "TASK_STATE_CANCELED",
}


def body_of(delivery: Delivery) -> bytes:
    """The JSON body of `delivery`, in its webhook's form."""
    notice = delivery.notice
    event = pb.Event.FromString(notice.event)
    if delivery.webhook.format == "agw":
        return orjson.dumps(
            {
                "id": delivery.delivery_id,
                "type": event.type,
                "runId": notice.run_id,
                "chatId": notice.chat_id,
                "agentKey": notice.agent_key,
                "state": notice.state,
                "event": codec.to_dict(event),
                "timestamp": notice.timestamp_ms,
            }
        )
    status: dict[str, Any] = {"timestamp": _iso(notice.timestamp_ms)}
    metadata: dict[str, Any] = {"agwType": event.type, **_end_metadata(event)}
    if event.HasField("run_error"):
        error = event.run_error.error
        status["message"] = {
            "messageId": f"{notice.run_id}-{event.seq}",
            "role": "ROLE_AGENT" if delivery.webhook.format == "a2a" else "agent",
            "parts": [{"text": error.message}]
            if delivery.webhook.format == "a2a"
            else [{"kind": "text", "text": error.message}],
        }
    if delivery.webhook.format == "a2a":
        status["state"] = STATES_V1[notice.state]
        update = {"taskId": notice.run_id, "contextId": notice.chat_id, "status": status}
        return orjson.dumps({"statusUpdate": {**update, "metadata": metadata}})
    status["state"] = notice.state
    task = {"kind": "task", "id": notice.run_id, "contextId": notice.chat_id, "status": status}
    return orjson.dumps({**task, "metadata": metadata})


def headers_of(delivery: Delivery, body: bytes, secret: str, now_s: int) -> dict[str, str]:
    """The headers of one attempt: JSON, signed with the webhook's secret (else `secret`,
    the service's; unsigned when neither is set), its token and authorization."""
    headers = {"Content-Type": "application/json", "User-Agent": "agw-webhooks"}
    key = delivery.webhook.secret or secret
    if key:
        headers.update(signature(delivery.delivery_id, now_s, body, key))
    if delivery.webhook.token:
        headers["X-A2A-Notification-Token"] = delivery.webhook.token
    if delivery.webhook.authorization:
        headers["Authorization"] = delivery.webhook.authorization
    return headers


def signature(delivery_id: str, now_s: int, body: bytes, secret: str) -> dict[str, str]:
    """The Standard Webhooks headers of a body."""
    signed = f"{delivery_id}.{now_s}.".encode() + body
    digest = hmac.new(key_of(secret), signed, hashlib.sha256).digest()
    return {
        "Webhook-Id": delivery_id,
        "Webhook-Timestamp": str(now_s),
        "Webhook-Signature": "v1," + base64.b64encode(digest).decode(),
    }


def key_of(secret: str) -> bytes:
    """The signing key of a secret: `whsec_<base64>` decoded, else its UTF-8 bytes."""
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
        except binascii.Error:
            pass
    return secret.encode()


def _end_metadata(event: pb.Event) -> dict[str, Any]:
    if event.HasField("run_complete"):
        complete = event.run_complete
        out: dict[str, Any] = {"finishReason": complete.finish_reason}
        if complete.HasField("usage"):
            out["usage"] = codec.to_dict(complete.usage)
        return out
    if event.HasField("run_error"):
        return {"error": codec.to_dict(event.run_error.error)}
    if event.HasField("run_cancel"):
        return {"reason": event.run_cancel.reason}
    return {}


def _iso(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
