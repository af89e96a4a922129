"""Receiving the service's webhooks: verified, deduplicated, queued, retried, never lost.

The interface recommends webhooks together with incremental pulls for large syncs, and leaves
topics, payloads, delivery rules and signing unspecified; so everything the sender decides is a
``WebhookConfig`` setting with a safe default (HMAC-SHA256 of the raw body, hex, in
``X-Service-Signature``; event id in ``"id"``, topic in ``"topic"``, record in ``"data"``), and
the schemes services use are one setting away (``scheme="timestamped"``: ``t=<unix>,v1=<hex>``;
``scheme="standard-webhooks"``: the Standard Webhooks specification)::

    from asyncsubs.webhooks import (
        SQLiteDeadLetters, SQLiteInbox, WebhookConfig, WebhookEvent, WebhookReceiver,
    )

    async def apply(event: WebhookEvent) -> None:
        if event.is_delete:
            await db.delete(event.resource, event.record_id)
        elif event.record is not None:
            await db.upsert(event.resource, event.record)    # raise to have it retried

    receiver = WebhookReceiver(
        WebhookConfig(os.environ["WEBHOOK_SECRET"]),
        apply,
        inbox=SQLiteInbox("hooks.db"),             # acknowledged = written down: survives a crash
        dead_letters=SQLiteDeadLetters("hooks.db"),
    )
    url = await receiver.listen("0.0.0.0", 8080)   # or receiver.app() / receiver.attach(app)
    ...
    await receiver.aclose()        # drains the queue; anything left stays in the inbox

A secret shared by several stores needs each store's ``store_id`` (the value the service sends
for it in the signed body); ``resolve_store_binding`` finds shared secrets among several stores'
configs and refuses those that cannot be bound. Refused deliveries are counted per reason in
``receiver.stats.refusals``, and the first of each ``Refusal`` is logged as a WARNING.

Webhooks can be lost (the sender gives up, the receiver is down): pair them with periodic
incremental pulls (a list endpoint filtered on ``updatedAt`` from before the previous pull
started); see docs/webhooks.md.
"""

from ._binding import resolve_store_binding
from ._config import WebhookConfig
from ._dead_letters import DeadLetter, DeadLetterStore, MemoryDeadLetters, SQLiteDeadLetters
from ._events import WebhookEvent, supersedes
from ._inbox import Inbox, InboxEntry, SQLiteInbox
from ._listener import Listener, ListenerLimits
from ._receiver import Handler, ReceiverStats, WebhookReceiver
from ._refusals import DeliveryRefused, Refusal
from ._signing import signature_header_value, signed_headers, verify_delivery

__all__ = [
    "DeadLetter",
    "DeadLetterStore",
    "DeliveryRefused",
    "Handler",
    "Inbox",
    "InboxEntry",
    "Listener",
    "ListenerLimits",
    "MemoryDeadLetters",
    "ReceiverStats",
    "Refusal",
    "SQLiteDeadLetters",
    "SQLiteInbox",
    "WebhookConfig",
    "WebhookEvent",
    "WebhookReceiver",
    "resolve_store_binding",
    "signature_header_value",
    "signed_headers",
    "supersedes",
    "verify_delivery",
]
