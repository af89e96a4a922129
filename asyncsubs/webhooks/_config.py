"""Webhook receiver configuration: the signature scheme, the event's shape, the store binding and
the delivery limits.

The interface does not say how deliveries are signed, so every choice the sender makes is a
setting here. The default is the most common scheme: HMAC-SHA256 of the raw body with a shared
secret, hex-encoded, in one header; the timestamped scheme and Standard Webhooks are one setting
away (``scheme``, see ``_signing``).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from .._config import positive_int, positive_number
from .._frozen import FrozenMap
from ..errors import ConfigError
from ._schemes import SCHEMES, Encoding, Scheme, signing_key

__all__ = ["DEFAULT_RESOURCE_ALIASES", "WebhookConfig"]

_ENCODINGS: Final = ("hex", "base64")
_HEADER_RE: Final = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

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
        raise ConfigError(f"must be an HTTP header name, got {value!r}", key=name, sep=" ")


def _key(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"must be a non-empty string or None, got {value!r}", key=name, sep=" ")


def _aliases(value: object) -> Mapping[str, str]:
    if value is None:
        return DEFAULT_RESOURCE_ALIASES
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError("resource_aliases must map str -> str")
    return FrozenMap(value)


def _by_scheme(hmac_value: Any, timestamped: Any, standard: Any) -> Any:
    """A default that depends on the config's ``scheme`` (declared before it)."""
    values = {"hmac": hmac_value, "timestamped": timestamped, "standard-webhooks": standard}
    return attrs.Factory(
        lambda self: values.get(self.scheme, hmac_value) if isinstance(self.scheme, str) else None,
        takes_self=True,
    )


@attrs.frozen
class WebhookConfig:
    """How deliveries are verified, parsed, bound to their store, deduplicated, queued and
    retried.

    Signing (``scheme``; see docs/webhooks.md for each scheme's one-line configuration):

    - ``secret``: the shared secret (str or bytes) as the service shows it (for Standard
      Webhooks the ``whsec_<base64>`` text); never logged and not in the repr.
    - ``previous_secrets``: also accepted, for rotating the secret without losing deliveries
      (a sender with several signs with each: ``signed_headers``).
    - ``scheme``: ``"hmac"`` (default: an HMAC of the raw body), ``"timestamped"`` (one header
      ``t=<unix>,v1=<hex>``, signed ``"<t>." + body``: Stripe's scheme) or
      ``"standard-webhooks"`` (``webhook-id``, ``webhook-timestamp``, ``webhook-signature``;
      signed ``"<id>.<timestamp>." + body``; the id is the event id).
    - ``signature_header`` (default ``X-Service-Signature``; ``webhook-signature`` for Standard
      Webhooks), ``encoding`` (``"hex"``, or ``"base64"``, base64url accepted too; Standard
      Webhooks: base64), ``algorithm`` (a ``hashlib`` name HMAC can use: ``"sha256"``,
      ``"sha1"``, ``"sha512"``; Standard Webhooks: sha256), ``signature_prefix`` (``hmac``
      only, e.g. ``"sha256="``). An ``hmac`` header may carry several comma-separated
      signatures; one matching is enough.
    - ``timestamp_header``: ``hmac``: off by default; when set, a delivery must carry that
      header (epoch seconds in ASCII digits, or ISO-8601 with a zone), and the signed bytes are
      ``b"<timestamp>." + body``: replay protection only holds when the timestamp is signed, so
      an unsigned one is not an option. Standard Webhooks: ``webhook-timestamp``;
      ``id_header``: ``webhook-id`` (both renamable, e.g. ``svix-timestamp``, ``svix-id``).
    - ``timestamp_tolerance``: seconds a signed timestamp may be from now, either way (300).

    Parsing (the JSON body must be an object; everything else is a 400). Everything that
    decides what a delivery does comes from what is signed, never from an unsigned header:

    - ``event_id_key``: the delivery's event id (Standard Webhooks: the signed ``webhook-id``
      instead); absent, a SHA-256 of the body stands in (identical replays are still caught).
    - ``topic_key``: e.g. ``"subscriptions/update"``, a string; required. It splits at its last
      ``/`` or ``.`` into resource and action; singular resources map through
      ``resource_aliases``.
    - ``data_key``: the record (None: the whole payload is the record); ``record_id_key`` in it.
    - ``created_at_key``: optional, copied onto the event; ``store_key``: the field naming the
      store (a string or an integer), copied onto the event.
    - ``delete_actions``: actions that mean the record is gone.

    The store (see docs/webhooks.md, "Stores"):

    - ``store_id``: the value the service sends in ``store_key`` for the store this config
      serves (a service may name a store by its shop domain, not by your name for it). Set, a
      delivery whose signed body does not carry it is refused (403).
    - ``shared_secret``: True when this secret also signs other stores' deliveries; then
      ``store_id`` is required, as a delivery for another store could otherwise be replayed to
      this store's URL. False: the secret is this store's own, its URL and signature identify
      the store, and the body need not name it. None (not said): a body naming a store in
      ``store_key`` must name the receiver's ``store``; one naming none is accepted.
      ``resolve_store_binding`` says it for several stores at once from their secrets.

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
    # Declared before the settings whose defaults depend on it.
    scheme: Scheme = attrs.field(default="hmac", kw_only=True)
    signature_header: str = attrs.field(
        default=_by_scheme("X-Service-Signature", "X-Service-Signature", "webhook-signature"),
        kw_only=True,
    )
    encoding: Encoding = attrs.field(default=_by_scheme("hex", "hex", "base64"), kw_only=True)
    algorithm: str = attrs.field(default="sha256", kw_only=True)
    signature_prefix: str = attrs.field(default="", kw_only=True)
    timestamp_header: str | None = attrs.field(
        default=_by_scheme(None, None, "webhook-timestamp"), kw_only=True
    )
    id_header: str | None = attrs.field(default=_by_scheme(None, None, "webhook-id"), kw_only=True)
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

    store_id: str | None = attrs.field(default=None, kw_only=True)
    shared_secret: bool | None = attrs.field(default=None, kw_only=True)

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
        self._check_signing()
        self._check_binding()
        for name in ("event_id_key", "data_key", "created_at_key", "store_key"):
            _key(name, getattr(self, name))
        if self.topic_key is None:
            raise ConfigError("topic_key is required: events are routed by their signed topic")
        _key("topic_key", self.topic_key)
        _key("record_id_key", self.record_id_key)
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

    def _check_signing(self) -> None:
        scheme = self.scheme
        if scheme not in SCHEMES:
            problem = f"must be one of {', '.join(SCHEMES)}, got {scheme!r}"
            raise ConfigError(problem, key="scheme", sep=" ")
        if self.encoding not in _ENCODINGS:
            problem = f"must be 'hex' or 'base64', got {self.encoding!r}"
            raise ConfigError(problem, key="encoding", sep=" ")
        if (
            not isinstance(self.algorithm, str)
            or self.algorithm not in hashlib.algorithms_available
        ):
            problem = f"must be a hashlib algorithm, got {self.algorithm!r}"
            raise ConfigError(problem, key="algorithm", sep=" ")
        try:
            # Some hashlib names (shake_128, shake_256, ...) cannot key an HMAC: every delivery
            # would then fail to verify, so they are refused here.
            hmac.new(b"k", b"", self.algorithm)
        except (ValueError, TypeError):
            problem = f"must be usable with HMAC, got {self.algorithm!r}"
            raise ConfigError(problem, key="algorithm", sep=" ") from None
        if not isinstance(self.signature_prefix, str):
            raise ConfigError("must be a string", key="signature_prefix", sep=" ")
        _header("signature_header", self.signature_header, optional=False)
        _header("timestamp_header", self.timestamp_header, optional=True)
        _header("id_header", self.id_header, optional=True)
        # A setting that does not fit the scheme is the error's key: a config file names it
        # as its own key.
        if scheme != "hmac" and self.signature_prefix:
            problem = f"is for the hmac scheme, not {scheme}"
            raise ConfigError(problem, key="signature_prefix", sep=" ")
        if scheme != "standard-webhooks" and self.id_header is not None:
            problem = (
                "is for the standard-webhooks scheme, the one that signs the id: an unsigned id "
                "header would let anyone slip a delivery past the dedupe"
            )
            raise ConfigError(problem, key="id_header", sep=" ")
        if scheme == "timestamped" and self.timestamp_header is not None:
            problem = (
                "is for the hmac scheme; the timestamped scheme reads its timestamp from t= in "
                "the signature header"
            )
            raise ConfigError(problem, key="timestamp_header", sep=" ")
        if scheme == "standard-webhooks":
            for name in ("timestamp_header", "id_header"):
                if getattr(self, name) is None:
                    problem = "is required by the standard-webhooks scheme"
                    raise ConfigError(problem, key=name, sep=" ")
            if (self.encoding, self.algorithm) != ("base64", "sha256"):
                raise ConfigError("the standard-webhooks scheme signs HMAC-SHA256 in base64")
            try:
                self.keys  # noqa: B018 -- decodes each secret: a bad one fails here, not per delivery
            except ValueError as exc:
                raise ConfigError(str(exc)) from None

    def _check_binding(self) -> None:
        _key("store_id", self.store_id)
        if self.shared_secret not in (None, True, False):
            raise ConfigError(
                f"shared_secret must be True, False or None, got {self.shared_secret!r}"
            )
        if self.store_id is not None and self.store_key is None:
            raise ConfigError("store_id needs store_key: the signed field that names the store")
        if self.shared_secret and (self.store_id is None or self.store_key is None):
            raise ConfigError(
                "shared_secret=True needs store_id (the value the service sends for this store "
                f"in the signed field store_key, {self.store_key!r}): a delivery for another "
                "store could otherwise be replayed to this store's URL; or give the store a "
                "secret of its own"
            )

    @property
    def secrets(self) -> tuple[bytes, ...]:
        """The secrets as given: ``secret``, then ``previous_secrets``."""
        return (self.secret, *self.previous_secrets)

    @property
    def keys(self) -> tuple[bytes, ...]:
        """The HMAC keys of ``secrets`` under the scheme (Standard Webhooks: base64-decoded)."""
        return tuple(signing_key(secret, self.scheme) for secret in self.secrets)

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed handler attempt number ``attempt`` (1-based)."""
        return min(self.handler_backoff_max, self.handler_backoff_initial * 2.0 ** (attempt - 1))
