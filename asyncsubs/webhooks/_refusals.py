"""Why a delivery was refused: the reasons a receiver counts, answers and logs.

A refused delivery is lost unless someone notices: senders give up after a few retries, and an
incremental pull cannot bring back a delete. So each reason carries its HTTP status and what to
check, the receiver counts refusals per reason (``ReceiverStats.refusals``) and logs the first
of each reason as a WARNING saying what to check.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

__all__ = ["DeliveryRefused", "Refusal"]


class Refusal(enum.StrEnum):
    """Why a delivery was refused; its value is the key in ``ReceiverStats.refusals`` and the
    ``reason`` in the answer's body. ``status`` is the HTTP status it is answered with, and
    ``hint`` says what to check."""

    #: No signature this receiver can read: the header is missing or empty, or holds nothing
    #: in the configured scheme and encoding.
    NO_SIGNATURE = "no_signature"
    #: Signatures, none of which matches the body under any of the secrets.
    BAD_SIGNATURE = "bad_signature"
    #: The signed timestamp is missing or not a timestamp.
    BAD_TIMESTAMP = "bad_timestamp"
    #: Correctly signed, but its timestamp is further from now than ``timestamp_tolerance``.
    STALE_TIMESTAMP = "stale_timestamp"
    #: Correctly signed, but for another store than the receiver's (403).
    WRONG_STORE = "wrong_store"
    #: Correctly signed, but not an event this configuration reads (400).
    NOT_AN_EVENT = "not_an_event"

    @property
    def status(self) -> int:
        return _STATUS.get(self, 401)

    @property
    def hint(self) -> str:
        return _HINTS[self]


_STATUS: Final[Mapping[Refusal, int]] = {Refusal.WRONG_STORE: 403, Refusal.NOT_AN_EVENT: 400}

_HINTS: Final[Mapping[Refusal, str]] = {
    Refusal.NO_SIGNATURE: (
        "the signature scheme and header the service uses (WebhookConfig scheme, "
        "signature_header, encoding, signature_prefix)"
    ),
    Refusal.BAD_SIGNATURE: (
        "the webhook secret (previous_secrets while it is rotated; a Standard Webhooks secret "
        "is the whole whsec_... text), the scheme's algorithm and encoding, and that nothing "
        "between the sender and this receiver changes the body"
    ),
    Refusal.BAD_TIMESTAMP: (
        "the signature scheme: the timestamp it signs is missing or not Unix seconds "
        "(WebhookConfig scheme, timestamp_header)"
    ),
    Refusal.STALE_TIMESTAMP: (
        "whether the delivery is a replay, and this host's clock (NTP): a genuine delivery "
        "signed further from now than timestamp_tolerance"
    ),
    Refusal.WRONG_STORE: (
        "the store id: the value the service sends for this store in the signed store field "
        "(WebhookConfig store_id, store_key), or shared_secret=False if this secret is the "
        "store's own"
    ),
    Refusal.NOT_AN_EVENT: (
        "the payload shape the service sends (WebhookConfig topic_key, data_key, event_id_key)"
    ),
}


class DeliveryRefused(Exception):
    """A delivery is refused for ``refusal``; ``detail`` says what was wrong with it (it never
    holds a secret or a whole signature)."""

    def __init__(self, refusal: Refusal, detail: str) -> None:
        super().__init__(refusal, detail)  # its arguments: it pickles
        self.refusal = refusal
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.refusal.value}: {self.detail}"
