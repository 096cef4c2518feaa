"""A2A push notifications: a task's push configurations, kept as its run's webhooks.

A push configuration (`url`, `token`, `authentication` {scheme, credentials}) of a task is
a webhook of its run in the A2A form of the request's protocol version (CreateRunWebhook,
format `WEBHOOK_FORMAT_A2A` or `WEBHOOK_FORMAT_A2A_V03`): the service then POSTs the task's
status to its `url` at each change of state (working, input-required, completed, failed,
canceled), with the token in `X-A2A-Notification-Token` and `Authorization: {scheme}
{credentials}`, retried until delivered (service/notify/). The configuration's `id` is the
webhook's; the credentials are never shown again.

| 1.0 method | 0.3 method | call |
|---|---|---|
| `CreateTaskPushNotificationConfig` | `tasks/pushNotificationConfig/set` | CreateRunWebhook |
| `GetTaskPushNotificationConfig` | `tasks/pushNotificationConfig/get` | GetRunWebhook (1) |
| `ListTaskPushNotificationConfigs` | `tasks/pushNotificationConfig/list` | ListRunWebhooks |
| `DeleteTaskPushNotificationConfig` | `tasks/pushNotificationConfig/delete` | DeleteRunWebhook |

(1) 0.3's get without a configuration id: the task's first configuration.

A message that starts a task may carry a configuration too (`configuration.
taskPushNotificationConfig` in 1.0, `configuration.pushNotificationConfig` in 0.3): it is
given with the query, so the task's first change is notified already.
"""

from __future__ import annotations

from typing import Any

from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc

from service.gateway.a2a import jsonrpc
from service.gateway.a2a.jsonrpc import RpcError
from service.gateway.metadata import Metadata
from service.gateway.status import shown

PUSH_SET, PUSH_GET, PUSH_LIST, PUSH_DELETE = "push_set", "push_get", "push_list", "push_delete"
PUSH_OPERATIONS = frozenset({PUSH_SET, PUSH_GET, PUSH_LIST, PUSH_DELETE})


def webhook_of(config: Any, version: str) -> gw.Webhook:
    """A push configuration (1.0 or 0.3 form) as the webhook of its task's run."""
    if not isinstance(config, dict):
        raise jsonrpc.params_error("the push notification configuration must be an object")
    url, token = config.get("url"), config.get("token", "")
    if not isinstance(url, str) or not url or not isinstance(token, str):
        raise jsonrpc.params_error("a push notification configuration needs its url (a string)")
    webhook = gw.Webhook(url=url, token=token, format=_FORMATS[version])
    authentication = config.get("authentication")
    if authentication is not None:
        if not isinstance(authentication, dict):
            raise jsonrpc.params_error("authentication must be an object")
        schemes = (
            [authentication.get("scheme")] if version == "1.0" else authentication.get("schemes")
        )
        credentials = authentication.get("credentials") or ""
        if not isinstance(schemes, list) or not isinstance(credentials, str):
            raise jsonrpc.params_error("authentication: its scheme(s) and credentials are strings")
        scheme = next((s for s in schemes if isinstance(s, str) and s), "")
        if scheme and credentials:
            webhook.authorization = f"{scheme} {credentials}"
    return webhook


class PushConfigs:
    """The push configuration methods, over the service's webhook RPCs."""

    def __init__(self, stub: gateway_pb2_grpc.AgentGatewayAsyncStub) -> None:
        self.stub = stub

    async def call(
        self, operation: str, params: dict[str, Any], version: str, metadata: Metadata
    ) -> Any:
        if operation == PUSH_SET:
            return await self._set(params, version, metadata)
        task_id = _string(params, "taskId" if version == "1.0" else "id", required=True)
        config_id = _string(params, "id" if version == "1.0" else "pushNotificationConfigId")
        if operation == PUSH_LIST:
            listed = await self.stub.ListRunWebhooks(
                gw.ListRunWebhooksRequest(run_id=task_id), metadata=metadata
            )
            configs = [_config(w, version) for w in listed.webhooks if _is_push(w)]
            return {"configs": configs, "nextPageToken": ""} if version == "1.0" else configs
        if not config_id and version == "0.3" and operation == PUSH_GET:  # the task's first
            listed = await self.stub.ListRunWebhooks(
                gw.ListRunWebhooksRequest(run_id=task_id), metadata=metadata
            )
            first = next((w for w in listed.webhooks if _is_push(w)), None)
            if first is None:
                raise RpcError(jsonrpc.INVALID_PARAMS, f"task {shown(task_id)!r} has none")
            return _config(first, version)
        if not config_id:
            raise jsonrpc.params_error("the push notification configuration's id is required")
        if operation == PUSH_GET:
            webhook = await self.stub.GetRunWebhook(
                gw.GetRunWebhookRequest(run_id=task_id, webhook_id=config_id), metadata=metadata
            )
            return _config(webhook, version)
        await self.stub.DeleteRunWebhook(
            gw.DeleteRunWebhookRequest(run_id=task_id, webhook_id=config_id), metadata=metadata
        )
        return {} if version == "1.0" else None

    async def _set(self, params: dict[str, Any], version: str, metadata: Metadata) -> Any:
        task_id = _string(params, "taskId", required=True)
        config = params if version == "1.0" else params.get("pushNotificationConfig")
        config_id = _string(config, "id") if isinstance(config, dict) else ""
        webhook = await self.stub.CreateRunWebhook(
            gw.CreateRunWebhookRequest(
                run_id=task_id, webhook=webhook_of(config, version), webhook_id=config_id
            ),
            metadata=metadata,
        )
        return _config(webhook, version)


_FORMATS = {"1.0": gw.WEBHOOK_FORMAT_A2A, "0.3": gw.WEBHOOK_FORMAT_A2A_V03}


def _is_push(webhook: gw.RunWebhook) -> bool:
    return webhook.format in (gw.WEBHOOK_FORMAT_A2A, gw.WEBHOOK_FORMAT_A2A_V03)


def _config(webhook: gw.RunWebhook, version: str) -> dict[str, Any]:
    """A run's webhook as a push configuration (its credentials not shown)."""
    config: dict[str, Any] = {"id": webhook.webhook_id, "url": webhook.url}
    if webhook.token:
        config["token"] = webhook.token
    if version == "1.0":
        return {"taskId": webhook.run_id, **config}
    return {"taskId": webhook.run_id, "pushNotificationConfig": config}


def _string(params: dict[str, Any], name: str, *, required: bool = False) -> str:
    value = params.get(name, "")
    if not isinstance(value, str) or (required and not value):
        raise jsonrpc.params_error(
            f"params.{name} must be a{' non-empty' if required else ''} string"
        )
    return value
