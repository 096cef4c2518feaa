"""Sending the runs' notifications to their webhooks (see service/core/webhooks.py).

`bodies.py` writes a notification in its webhook's form (agw, A2A 1.0, A2A 0.3) and signs
it; `sender.py` takes the due ones from the `WebhookStore`, POSTs them and retries.
"""

from service.notify.sender import WebhookSender

__all__ = ["WebhookSender"]
