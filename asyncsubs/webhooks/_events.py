"""Parsed webhook events and the dedupe window."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .. import _json
from .._versions import older
from ._config import WebhookConfig

__all__ = ["DedupeWindow", "EventParseError", "WebhookEvent", "parse_event", "supersedes"]


@attrs.frozen
class WebhookEvent:
    """One delivery, verified and parsed.

    - ``id``: the event id: the body's ``event_id_key``, or the signed ``webhook-id`` of a
      Standard Webhooks delivery; a SHA-256 of the body when the sender sent none.
    - ``topic``: as sent, e.g. ``"subscriptions/update"``; ``resource`` (``"subscriptions"``) and
      ``action`` (``"update"``) are split from it.
    - ``record``: the record the event carries (a dict), or None; ``record_id`` its id.
    - ``is_delete``: the action is one of ``WebhookConfig.delete_actions``.
    - ``store`` (``store_key``; an integer becomes its digits), ``created_at``: from the body
      when the sender includes them.
    - ``received_at``: epoch seconds when the delivery was accepted; ``raw``: the whole body.
    """

    id: str
    topic: str
    resource: str
    action: str
    record: Mapping[str, Any] | None
    record_id: Any
    is_delete: bool
    received_at: float
    store: str | None = None
    created_at: str | None = None
    raw: Mapping[str, Any] = attrs.field(factory=dict, repr=False, eq=False)


class EventParseError(ValueError):
    """The body is not an event this configuration can read (answered with 400)."""


def _text(value: object) -> str | None:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def split_topic(topic: str, aliases: Mapping[str, str]) -> tuple[str, str]:
    """``"subscriptions/update"`` -> (``"subscriptions"``, ``"update"``); the last ``/`` or ``.``
    splits, so ``"subscription.updated"`` works too. No separator: the action is empty."""
    cut = max(topic.rfind("/"), topic.rfind("."))
    resource, action = (topic, "") if cut < 0 else (topic[:cut], topic[cut + 1 :])
    return aliases.get(resource, resource), action


def parse_event(
    config: WebhookConfig,
    body: bytes,
    *,
    received_at: float | None = None,
    event_id: str | None = None,
) -> WebhookEvent:
    """Parse a delivery body (already verified); raises EventParseError.

    Only what the signature covers is read: the body, and ``event_id`` when the scheme signs
    one outside it (Standard Webhooks' ``webhook-id``), so a captured delivery cannot be
    turned into another event by changing its headers."""
    try:
        payload = _json.loads(body)  # ids beyond 64 bits stay exact
    except ValueError as exc:
        raise EventParseError(f"body is not valid JSON ({exc})") from None
    if not isinstance(payload, dict):
        raise EventParseError("body must be a JSON object")
    if event_id is None and config.event_id_key is not None:
        event_id = _text(payload.get(config.event_id_key))
    if event_id is None:
        # Without an id, identical bodies are the same delivery resent.
        event_id = "sha256:" + hashlib.sha256(body).hexdigest()

    topic = payload.get(config.topic_key)
    if not isinstance(topic, str) or not topic:
        raise EventParseError(f"the event has no topic (a string in {config.topic_key!r})")
    resource, action = split_topic(topic, config.resource_aliases)

    data = payload if config.data_key is None else payload.get(config.data_key)
    record = data if isinstance(data, dict) else None
    record_id = None if record is None else record.get(config.record_id_key)

    def optional(key: str | None) -> str | None:
        value = None if key is None else payload.get(key)
        return value if isinstance(value, str) else None

    return WebhookEvent(
        id=event_id,
        topic=topic,
        resource=resource,
        action=action,
        record=record,
        record_id=record_id,
        is_delete=action.lower() in config.delete_actions,
        received_at=time.time() if received_at is None else received_at,
        store=None if config.store_key is None else _text(payload.get(config.store_key)),
        created_at=optional(config.created_at_key),
        raw=payload,
    )


class DedupeWindow:
    """Event ids seen in the last ``window`` seconds, at most ``max_entries`` of them.

    Ids are kept in arrival order, so expiry and the size bound both drop from the front in
    O(1) amortised: memory stays bounded however many deliveries arrive.
    """

    def __init__(
        self,
        window: float,
        max_entries: int,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window = window
        self.max_entries = max_entries
        self._clock = clock
        self._expires: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        self._expire(self._clock())
        return len(self._expires)

    def _expire(self, now: float) -> None:
        expires = self._expires
        while expires:
            oldest, deadline = next(iter(expires.items()))
            if deadline > now:
                break
            del expires[oldest]

    def __contains__(self, event_id: object) -> bool:
        now = self._clock()
        self._expire(now)
        return event_id in self._expires

    def add(self, event_id: str) -> None:
        now = self._clock()
        self._expire(now)
        self._expires.pop(event_id, None)
        self._expires[event_id] = now + self.window
        while len(self._expires) > self.max_entries:
            self._expires.popitem(last=False)

    def discard(self, event_id: str) -> None:
        self._expires.pop(event_id, None)


def supersedes(
    incoming: Mapping[str, Any], current: Mapping[str, Any] | None, *, field: str = "updatedAt"
) -> bool:
    """Whether ``incoming`` should replace ``current`` (a stored copy of the same record).

    True unless ``incoming``'s ``field`` is older than ``current``'s (numbers as numbers,
    timestamps as instants, other text as text: ``asyncsubs._versions``): webhooks may arrive
    late or out of order, and an older version must
    not overwrite a newer one. Equal stamps replace (second precision cannot order them; the
    next incremental pull, which is inclusive, settles it), as do stamps that do not compare.
    """
    return current is None or not older(incoming.get(field), current.get(field))
