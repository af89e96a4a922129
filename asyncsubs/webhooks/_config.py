"""Webhook receiver configuration and the signature scheme.

The interface does not say how deliveries are signed, so every choice the sender makes is a
setting here. The default is the most common scheme: HMAC-SHA256 of the raw body with a shared
secret, hex-encoded, in one header.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Final, Literal

import attrs

from .._config import positive_int, positive_number
from .._frozen import FrozenMap
from ..errors import ConfigError

__all__ = [
    "DEFAULT_RESOURCE_ALIASES",
    "Encoding",
    "WebhookConfig",
    "decode_signature",
    "sign",
    "signature_header_value",
    "signed_bytes",
    "timestamp_within",
    "verify",
]

Encoding = Literal["hex", "base64"]
_ENCODINGS: Final = ("hex", "base64")
_HEADER_RE: Final = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_EPOCH_RE: Final = re.compile(r"[0-9]+(?:\.[0-9]+)?")

#: Singular topic nouns ("subscription.updated") mapped to the list endpoint they belong to.
DEFAULT_RESOURCE_ALIASES: Mapping[str, str] = FrozenMap(
    {"subscription": "subscriptions", "customer": "customers", "order": "orders"}
)


def _secret(value: object) -> bytes:
    if isinstance(value, str):
        value = value.encode("utf-8")
    if not isinstance(value, bytes | bytearray) or not value:
        # The value itself is never echoed: it is a secret.
        raise ConfigError("webhook secret must be a non-empty str or bytes")
    return bytes(value)


def _secrets(value: object) -> tuple[bytes, ...]:
    if isinstance(value, str | bytes | bytearray):
        return (_secret(value),)
    if not isinstance(value, Iterable):
        raise ConfigError("previous_secrets must be a sequence of str or bytes")
    return tuple(_secret(v) for v in value)


def _header(name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not _HEADER_RE.match(value):
        raise ConfigError(f"{name} must be an HTTP header name, got {value!r}")


def _key(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{name} must be a non-empty string or None, got {value!r}")


def _aliases(value: object) -> Mapping[str, str]:
    if value is None:
        return DEFAULT_RESOURCE_ALIASES
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError("resource_aliases must map str -> str")
    return FrozenMap(value)


@attrs.frozen
class WebhookConfig:
    """How deliveries are verified, parsed, deduplicated, queued and retried.

    Signing (defaults: HMAC-SHA256 over the raw body, hex, header ``X-Service-Signature``):

    - ``secret``: the shared secret (str or bytes); never logged and not in the repr.
    - ``previous_secrets``: also accepted, for rotating the secret without losing deliveries.
    - ``signature_header``, ``encoding`` (``"hex"`` or ``"base64"``; base64url accepted too),
      ``algorithm`` (a ``hashlib`` name HMAC can use: ``"sha256"``, ``"sha1"``, ``"sha512"``),
      ``signature_prefix`` (e.g. ``"sha256="``). A header may carry several comma-separated
      signatures; one matching is enough.
    - ``timestamp_header``: off by default. When set, a delivery must carry that header (epoch
      seconds in ASCII digits, or ISO-8601 with a zone) within ``timestamp_tolerance`` seconds
      of now, and the signed bytes are ``b"<timestamp>." + body``: replay protection only
      holds when the timestamp is signed, so an unsigned one is not an option.

    Parsing (the JSON body must be an object; everything else is a 400). Everything that
    decides what a delivery does comes from the signed body, never from an unsigned header:

    - ``event_id_key``: the delivery's event id; absent, a SHA-256 of the body stands in
      (identical replays are still caught).
    - ``topic_key``: e.g. ``"subscriptions/update"``, a string; required. It splits at its last
      ``/`` or ``.`` into resource and action; singular resources map through
      ``resource_aliases``.
    - ``data_key``: the record (None: the whole payload is the record); ``record_id_key`` in it.
    - ``created_at_key``, ``store_key``: optional fields copied onto the event.
    - ``delete_actions``: actions that mean the record is gone.

    Delivery:

    - ``max_body_bytes`` (413 above it), ``dedupe_window`` seconds / ``dedupe_max_entries`` ids,
      ``queue_size`` (503 + ``Retry-After: retry_after`` when full), ``workers``.
    - ``max_handler_attempts`` per event, backoff ``handler_backoff_initial`` doubling up to
      ``handler_backoff_max`` seconds; then the event goes to the dead-letter store.
    """

    secret: bytes = attrs.field(converter=_secret, repr=False)
    previous_secrets: tuple[bytes, ...] = attrs.field(
        default=(), converter=_secrets, repr=False, kw_only=True
    )
    signature_header: str = attrs.field(default="X-Service-Signature", kw_only=True)
    encoding: Encoding = attrs.field(default="hex", kw_only=True)
    algorithm: str = attrs.field(default="sha256", kw_only=True)
    signature_prefix: str = attrs.field(default="", kw_only=True)
    timestamp_header: str | None = attrs.field(default=None, kw_only=True)
    timestamp_tolerance: float = attrs.field(default=300.0, kw_only=True)

    event_id_key: str | None = attrs.field(default="id", kw_only=True)
    topic_key: str = attrs.field(default="topic", kw_only=True)
    data_key: str | None = attrs.field(default="data", kw_only=True)
    record_id_key: str = attrs.field(default="id", kw_only=True)
    created_at_key: str | None = attrs.field(default="createdAt", kw_only=True)
    store_key: str | None = attrs.field(default="store", kw_only=True)
    delete_actions: frozenset[str] = attrs.field(
        default=frozenset({"delete", "deleted", "remove", "removed"}),
        converter=frozenset,
        kw_only=True,
    )
    resource_aliases: Mapping[str, str] = attrs.field(
        default=None, converter=_aliases, kw_only=True
    )

    max_body_bytes: int = attrs.field(default=1024 * 1024, kw_only=True)
    dedupe_window: float = attrs.field(default=3600.0, kw_only=True)
    dedupe_max_entries: int = attrs.field(default=100_000, kw_only=True)
    queue_size: int = attrs.field(default=1000, kw_only=True)
    workers: int = attrs.field(default=1, kw_only=True)
    retry_after: int = attrs.field(default=1, kw_only=True)
    max_handler_attempts: int = attrs.field(default=5, kw_only=True)
    handler_backoff_initial: float = attrs.field(default=0.5, kw_only=True)
    handler_backoff_max: float = attrs.field(default=30.0, kw_only=True)

    def __attrs_post_init__(self) -> None:
        if self.encoding not in _ENCODINGS:
            raise ConfigError(f"encoding must be 'hex' or 'base64', got {self.encoding!r}")
        if (
            not isinstance(self.algorithm, str)
            or self.algorithm not in hashlib.algorithms_available
        ):
            raise ConfigError(f"algorithm must be a hashlib algorithm, got {self.algorithm!r}")
        try:
            # Some hashlib names (shake_128, shake_256, ...) cannot key an HMAC: every delivery
            # would then fail in verify(), so they are refused here.
            hmac.new(b"k", b"", self.algorithm)
        except (ValueError, TypeError):
            raise ConfigError(
                f"algorithm must be usable with HMAC, got {self.algorithm!r}"
            ) from None
        _header("signature_header", self.signature_header, optional=False)
        _header("timestamp_header", self.timestamp_header, optional=True)
        for name in ("event_id_key", "data_key", "created_at_key", "store_key"):
            _key(name, getattr(self, name))
        if self.topic_key is None:
            raise ConfigError("topic_key is required: events are routed by their signed topic")
        _key("topic_key", self.topic_key)
        _key("record_id_key", self.record_id_key)
        if not isinstance(self.signature_prefix, str):
            raise ConfigError("signature_prefix must be a string")
        for name in ("timestamp_tolerance", "dedupe_window"):
            positive_number(name, getattr(self, name))
        for name in ("handler_backoff_initial", "handler_backoff_max"):
            positive_number(name, getattr(self, name))
        if self.handler_backoff_max < self.handler_backoff_initial:
            raise ConfigError("handler_backoff_max must be >= handler_backoff_initial")
        for name in (
            "max_body_bytes",
            "dedupe_max_entries",
            "queue_size",
            "workers",
            "retry_after",
            "max_handler_attempts",
        ):
            positive_int(name, getattr(self, name))

    @property
    def secrets(self) -> tuple[bytes, ...]:
        return (self.secret, *self.previous_secrets)

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed handler attempt number ``attempt`` (1-based)."""
        return min(self.handler_backoff_max, self.handler_backoff_initial * 2.0 ** (attempt - 1))


def timestamp_within(value: str | None, now: float, tolerance: float) -> bool:
    """True when ``value`` (epoch seconds: ASCII digits, optionally a fraction; or ISO-8601 with
    a zone) is within ``tolerance`` seconds of ``now``, either way.

    Only ASCII is a timestamp: ``float()`` also takes other scripts' digits, which cannot be
    signed as ``b"<timestamp>."`` (and ``signed_bytes`` would fail on them)."""
    if not value or not value.isascii():
        return False
    value = value.strip()
    if _EPOCH_RE.fullmatch(value):
        stamp = float(value)
    else:
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return False
        if parsed.tzinfo is None:
            return False
        stamp = parsed.timestamp()
    return math.isfinite(stamp) and abs(now - stamp) <= tolerance


def signed_bytes(body: bytes, timestamp: str | None) -> bytes:
    """What is signed: the raw body, or ``b"<timestamp>." + body`` with a timestamp header."""
    return body if timestamp is None else timestamp.encode("ascii") + b"." + body


def sign(secret: str | bytes, body: bytes, *, algorithm: str = "sha256") -> bytes:
    """The raw HMAC digest of ``body`` (exactly the bytes received) under ``secret``."""
    return hmac.new(_secret(secret), body, algorithm).digest()


def signature_header_value(
    secret: str | bytes,
    body: bytes,
    *,
    algorithm: str = "sha256",
    encoding: Encoding = "hex",
    prefix: str = "",
) -> str:
    """The header value a sender puts on a delivery (used by the fake server's sender)."""
    digest = sign(secret, body, algorithm=algorithm)
    text = digest.hex() if encoding == "hex" else base64.b64encode(digest).decode("ascii")
    return prefix + text


def decode_signature(text: str, encoding: Encoding) -> bytes | None:
    """The digest bytes of one signature as sent, or None when it is not valid ``encoding``."""
    text = text.strip()
    if not text or not text.isascii():
        return None
    try:
        if encoding == "hex":
            if len(text) % 2 or not all(c in "0123456789abcdefABCDEF" for c in text):
                return None
            return bytes.fromhex(text)
        # Standard or URL-safe alphabet, padding optional.
        normal = text.translate(str.maketrans("-_", "+/"))
        return base64.b64decode(normal + "=" * (-len(normal) % 4), validate=True)
    except (ValueError, binascii.Error):
        return None


def verify(config: WebhookConfig, header: str | None, signed: bytes) -> bool:
    """True when one signature in ``header`` matches ``signed`` under one of the secrets.

    Digests are compared in constant time; every candidate is checked against every secret,
    so timing does not reveal which one (if any) was close.
    """
    if not header:
        return False
    given: list[bytes] = []
    for part in header.split(","):
        part = part.strip()
        prefix = config.signature_prefix
        if prefix:
            if not part.startswith(prefix):
                continue
            part = part[len(prefix) :]
        digest = decode_signature(part, config.encoding)
        if digest is not None:
            given.append(digest)
    if not given:
        return False
    ok = False
    for secret in config.secrets:
        expected = hmac.new(secret, signed, config.algorithm).digest()
        for candidate in given:
            ok |= hmac.compare_digest(expected, candidate)
    return ok
