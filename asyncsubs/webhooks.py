"""Receiving the service's webhooks: verified, deduplicated, queued, retried, never lost.

The interface recommends webhooks together with incremental pulls for large syncs, and leaves
topics, payloads, delivery rules and signing unspecified; so everything the sender decides is a
``WebhookConfig`` setting with a safe default (HMAC-SHA256 of the raw body, hex, in
``X-Service-Signature``; event id in ``"id"``, topic in ``"topic"``, record in ``"data"``)::

    from asyncsubs.webhooks import WebhookConfig, WebhookEvent, WebhookReceiver, SQLiteDeadLetters

    async def apply(event: WebhookEvent) -> None:
        if event.is_delete:
            await db.delete(event.resource, event.record_id)
        elif event.record is not None:
            await db.upsert(event.resource, event.record)    # raise to have it retried

    receiver = WebhookReceiver(
        WebhookConfig(os.environ["WEBHOOK_SECRET"]),
        apply,
        dead_letters=SQLiteDeadLetters("subs.db"),
    )
    url = await receiver.listen("0.0.0.0", 8080)   # or receiver.app() / receiver.attach(app)
    ...
    await receiver.close()        # drains the queue; anything left goes to the dead letters

Webhooks can be lost (the sender gives up, the receiver is down): pair them with periodic
incremental pulls (a list endpoint filtered on ``updatedAt`` from before the previous pull
started); see docs/webhooks.md.
"""

from ._webhooks_config import (
    DEFAULT_RESOURCE_ALIASES,
    Encoding,
    WebhookConfig,
    decode_signature,
    sign,
    signature_header_value,
    verify,
)
from ._webhooks_dead import (
    DEAD_LETTER_TABLE,
    DeadLetter,
    DeadLetterStore,
    MemoryDeadLetters,
    SQLiteDeadLetters,
)
from ._webhooks_events import DedupeWindow, EventParseError, WebhookEvent, parse_event, supersedes
from ._webhooks_receiver import DEFAULT_PATH, Handler, ReceiverStats, WebhookReceiver

__all__ = [
    "DEAD_LETTER_TABLE",
    "DEFAULT_PATH",
    "DEFAULT_RESOURCE_ALIASES",
    "DeadLetter",
    "DeadLetterStore",
    "DedupeWindow",
    "Encoding",
    "EventParseError",
    "Handler",
    "MemoryDeadLetters",
    "ReceiverStats",
    "SQLiteDeadLetters",
    "WebhookConfig",
    "WebhookEvent",
    "WebhookReceiver",
    "decode_signature",
    "parse_event",
    "sign",
    "signature_header_value",
    "supersedes",
    "verify",
]
