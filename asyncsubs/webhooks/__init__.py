"""Receiving the service's webhooks: verified, deduplicated, queued, retried, never lost.

The interface recommends webhooks together with incremental pulls for large syncs, and leaves
topics, payloads, delivery rules and signing unspecified; so everything the sender decides is a
``WebhookConfig`` setting with a safe default (HMAC-SHA256 of the raw body, hex, in
``X-Service-Signature``; event id in ``"id"``, topic in ``"topic"``, record in ``"data"``)::

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

Webhooks can be lost (the sender gives up, the receiver is down): pair them with periodic
incremental pulls (a list endpoint filtered on ``updatedAt`` from before the previous pull
started); see docs/webhooks.md.
"""

from ._config import WebhookConfig, signature_header_value
from ._dead_letters import DeadLetter, DeadLetterStore, MemoryDeadLetters, SQLiteDeadLetters
from ._events import WebhookEvent, supersedes
from ._inbox import Inbox, InboxEntry, SQLiteInbox
from ._listener import Listener, ListenerLimits
from ._receiver import Handler, ReceiverStats, WebhookReceiver

__all__ = [
    "DeadLetter",
    "DeadLetterStore",
    "Handler",
    "Inbox",
    "InboxEntry",
    "Listener",
    "ListenerLimits",
    "MemoryDeadLetters",
    "ReceiverStats",
    "SQLiteDeadLetters",
    "SQLiteInbox",
    "WebhookConfig",
    "WebhookEvent",
    "WebhookReceiver",
    "signature_header_value",
    "supersedes",
]
