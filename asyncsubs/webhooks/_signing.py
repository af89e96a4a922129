"""The signature schemes services use: what a sender signs, and how a receiver checks it. Pure: no
I/O, no aiohttp.

- ``hmac``: an HMAC of the raw body (with ``timestamp_header``: of ``b"<timestamp>." + body``),
  hex or base64, in one header that may list several signatures separated by commas, each with
  an optional prefix such as ``sha256=``.
- ``timestamped`` (Stripe's scheme): one header ``t=<unix seconds>,v1=<hex>[,v1=<hex>...]``, the
  HMAC-SHA256 of ``b"<t>." + body``; one ``v1`` per secret while a secret is rotated, other
  schemes (Stripe's test-mode ``v0``) ignored.
- ``standard-webhooks`` (the Standard Webhooks specification 1.0.0, standardwebhooks.com):
  headers ``webhook-id``, ``webhook-timestamp`` (Unix seconds) and ``webhook-signature``, a
  space-separated list of ``v1,<base64>`` entries, the HMAC-SHA256 of
  ``b"<id>.<timestamp>." + body`` under the key a ``whsec_<base64>`` secret decodes to. The id is
  signed, so it is the event id. The asymmetric ``v1a`` (ed25519) entries are not supported.

Digests are compared in constant time, each candidate against each secret, so timing does not
tell which (if any) came close. A timestamp is compared with the clock only once the signature
holds: a stale timestamp is then a genuine delivery replayed (or a clock that is off), never a
forgery, and nothing an unsigned header says decides anything.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import math
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Final

from ._config import WebhookConfig
from ._refusals import DeliveryRefused, Refusal
from ._schemes import SCHEMES, Encoding, Scheme, signing_key

__all__ = [
    "Encoding",
    "SCHEMES",
    "Scheme",
    "decode_signature",
    "sign",
    "signature_header_value",
    "signed_headers",
    "signing_key",
    "timestamp_within",
    "verify_delivery",
]

_EPOCH_RE: Final = re.compile(r"[0-9]+(?:\.[0-9]+)?")
#: Unix seconds as the timestamped and Standard Webhooks schemes send them: ASCII digits.
_UNIX_SECONDS_RE: Final = re.compile(r"[0-9]{1,12}")


def _epoch(value: str | None) -> float | None:
    """Epoch seconds of ``value`` (ASCII digits, optionally a fraction; or ISO-8601 with a zone),
    or None when it is not one. Only ASCII: ``float()`` also reads other scripts' digits, which
    cannot be signed as ``b"<timestamp>."``."""
    if not value or not value.isascii():
        return None
    value = value.strip()
    if _EPOCH_RE.fullmatch(value):
        stamp = float(value)
    else:
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return None
        if parsed.tzinfo is None:
            return None
        stamp = parsed.timestamp()
    return stamp if math.isfinite(stamp) else None


def timestamp_within(value: str | None, now: float, tolerance: float) -> bool:
    """True when ``value`` (see ``_epoch``) is within ``tolerance`` seconds of ``now``."""
    stamp = _epoch(value)
    return stamp is not None and abs(now - stamp) <= tolerance


def _check_age(stamp: float, text: str, now: float, tolerance: float) -> None:
    age = now - stamp
    if abs(age) > tolerance:
        direction = "in the past" if age > 0 else "ahead of this host's clock"
        raise DeliveryRefused(
            Refusal.STALE_TIMESTAMP,
            f"its signed timestamp {text} is {abs(age):,.0f} s {direction} "
            f"(timestamp_tolerance {tolerance:g} s)",
        )


def sign(secret: str | bytes, body: bytes, *, algorithm: str = "sha256") -> bytes:
    """The raw HMAC digest of ``body`` (exactly the bytes received) under ``secret``."""
    key = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    return hmac.new(key, body, algorithm).digest()


def _encode(digest: bytes, encoding: Encoding) -> str:
    return digest.hex() if encoding == "hex" else base64.b64encode(digest).decode("ascii")


def signature_header_value(
    secret: str | bytes,
    body: bytes,
    *,
    algorithm: str = "sha256",
    encoding: Encoding = "hex",
    prefix: str = "",
) -> str:
    """The ``hmac`` scheme's header value for ``body`` under one secret (see ``signed_headers``
    for every scheme)."""
    return prefix + _encode(sign(secret, body, algorithm=algorithm), encoding)


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


def _matches(config: WebhookConfig, signed: bytes, candidates: Iterable[bytes]) -> bool:
    given = list(candidates)
    ok = False
    for key in config.keys:
        expected = hmac.new(key, signed, config.algorithm).digest()
        for candidate in given:
            ok |= hmac.compare_digest(expected, candidate)
    return ok


def _missing(header: str, what: str) -> DeliveryRefused:
    return DeliveryRefused(Refusal.NO_SIGNATURE, f"missing or empty {header} header ({what})")


def _unix_seconds(value: str | None, header: str) -> int:
    if not value:
        raise DeliveryRefused(Refusal.BAD_TIMESTAMP, f"no timestamp in {header}")
    value = value.strip()
    if not _UNIX_SECONDS_RE.fullmatch(value):
        raise DeliveryRefused(
            Refusal.BAD_TIMESTAMP,
            f"the timestamp in {header} is not Unix seconds (ASCII digits): {value[:40]!r}",
        )
    return int(value)


def _lines(headers: Mapping[str, str], name: str) -> list[str]:
    """Every line of header ``name``: a field sent in several lines is one list (RFC 9110 5.3),
    which a sender or a proxy may split a rotation's signatures into; ``headers.get`` reads
    only the first of aiohttp's (multidict) headers."""
    getall = getattr(headers, "getall", None)
    if getall is not None:
        return list(getall(name, ()))
    value = headers.get(name)
    return [] if value is None else [value]


def _field(headers: Mapping[str, str], name: str, separator: str) -> str | None:
    """Header ``name`` whole, its lines joined by ``separator``; None when absent."""
    return separator.join(lines) if (lines := _lines(headers, name)) else None


def _verify_hmac(
    config: WebhookConfig, headers: Mapping[str, str], body: bytes, now: float
) -> None:
    name = config.signature_header
    stamp_text = None
    stamp = 0.0
    if config.timestamp_header is not None:
        stamp_text = headers.get(config.timestamp_header)
        parsed = _epoch(stamp_text)
        if stamp_text is None or parsed is None:
            shown = "none" if not stamp_text else repr(stamp_text[:40])
            raise DeliveryRefused(
                Refusal.BAD_TIMESTAMP,
                f"{config.timestamp_header} is not epoch seconds or ISO-8601 with a zone: {shown}",
            )
        stamp = parsed
    header = _field(headers, name, ",")
    if not header:
        raise _missing(name, f"{config.encoding} HMAC-{config.algorithm.upper()} of the body")
    given = []
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
        expected = f"{config.signature_prefix}<{config.encoding}>"
        raise DeliveryRefused(
            Refusal.NO_SIGNATURE,
            f"missing signature: nothing in {name} reads as {expected}",
        )
    signed = body if stamp_text is None else stamp_text.encode("ascii") + b"." + body
    if not _matches(config, signed, given):
        what = "the body" if stamp_text is None else f'"<{config.timestamp_header}>." + the body'
        raise DeliveryRefused(
            Refusal.BAD_SIGNATURE,
            f"no signature in {name} matches {what} under the configured secrets",
        )
    if stamp_text is not None:
        _check_age(stamp, stamp_text.strip(), now, config.timestamp_tolerance)


def _verify_timestamped(
    config: WebhookConfig, headers: Mapping[str, str], body: bytes, now: float
) -> None:
    name = config.signature_header
    lines = _lines(headers, name)
    header = ",".join(lines)
    if not header:
        raise _missing(name, "t=<unix seconds>,v1=<signature>")
    if len(lines) > 1 and header.count("t=") > 1:
        # A sender's line per secret, each t=...,v1=...: one of them verifying is enough.
        first: DeliveryRefused | None = None
        for line in lines:
            try:
                _verify_timestamped_field(config, name, line, body, now)
                return
            except DeliveryRefused as refused:
                first = first or refused
        assert first is not None
        raise first
    _verify_timestamped_field(config, name, header, body, now)


def _verify_timestamped_field(
    config: WebhookConfig, name: str, header: str, body: bytes, now: float
) -> None:
    stamps, given = [], []
    for item in header.split(","):
        label, sep, value = item.strip().partition("=")
        if not sep:
            continue
        if label == "t":
            stamps.append(value)
        elif label == "v1":
            digest = decode_signature(value, config.encoding)
            if digest is not None:
                given.append(digest)
    if len(stamps) != 1:
        raise DeliveryRefused(
            Refusal.BAD_TIMESTAMP, f"{name} holds {len(stamps)} t= timestamps, not one"
        )
    stamp_text = stamps[0].strip()
    stamp = _unix_seconds(stamp_text, f"{name}'s t=")
    if not given:
        raise DeliveryRefused(
            Refusal.NO_SIGNATURE,
            f"missing signature: no v1=<{config.encoding}> in {name} (other schemes are ignored)",
        )
    if not _matches(config, stamp_text.encode("ascii") + b"." + body, given):
        raise DeliveryRefused(
            Refusal.BAD_SIGNATURE,
            f'no v1 signature in {name} matches "<t>." + the body under the configured secrets',
        )
    _check_age(stamp, stamp_text, now, config.timestamp_tolerance)


def _standard_headers(config: WebhookConfig) -> tuple[str, str]:
    id_header, stamp_header = config.id_header, config.timestamp_header
    if id_header is None or stamp_header is None:  # WebhookConfig refuses that
        raise ValueError("the standard-webhooks scheme needs id_header and timestamp_header")
    return id_header, stamp_header


def _verify_standard(
    config: WebhookConfig, headers: Mapping[str, str], body: bytes, now: float
) -> str:
    id_header, stamp_header = _standard_headers(config)
    name = config.signature_header
    header = _field(headers, name, " ")
    if not header:
        raise _missing(name, "v1,<base64> entries")
    message_id = headers.get(id_header)
    if not message_id:
        raise _missing(id_header, "the message id, which the signature covers")
    stamp_text = (headers.get(stamp_header) or "").strip()
    stamp = _unix_seconds(stamp_text, stamp_header)
    given = []
    for entry in header.split():
        version, sep, value = entry.partition(",")
        if version == "v1" and sep:
            digest = decode_signature(value, "base64")
            if digest is not None:
                given.append(digest)
    if not given:
        raise DeliveryRefused(
            Refusal.NO_SIGNATURE,
            f"missing signature: no v1,<base64> entry in {name} (v1a, ed25519, is not supported)",
        )
    try:
        signed = f"{message_id}.{stamp_text}.".encode() + body
    except UnicodeEncodeError:  # a header's undecodable bytes: never what was signed
        signed = b""
    if not signed or not _matches(config, signed, given):
        raise DeliveryRefused(
            Refusal.BAD_SIGNATURE,
            f'no v1 signature in {name} matches "<{id_header}>.<{stamp_header}>." + the body '
            "under the configured secrets",
        )
    _check_age(stamp, stamp_text, now, config.timestamp_tolerance)
    return message_id


def verify_delivery(
    config: WebhookConfig, headers: Mapping[str, str], body: bytes, now: float
) -> str | None:
    """Check the delivery of ``body`` with ``headers`` (case-insensitive, as aiohttp's) under
    ``config``'s scheme and secrets at ``now`` (epoch seconds). Returns the event id the
    signature covers outside the body (Standard Webhooks' message id), else None; raises
    ``DeliveryRefused``."""
    if config.scheme == "standard-webhooks":
        return _verify_standard(config, headers, body, now)
    if config.scheme == "timestamped":
        _verify_timestamped(config, headers, body, now)
    else:
        _verify_hmac(config, headers, body, now)
    return None


def signed_headers(
    config: WebhookConfig, body: bytes, *, timestamp: float, event_id: str | None = None
) -> dict[str, str]:
    """The headers a sender puts on a delivery of ``body`` under ``config``: one signature per
    secret (several while a secret is rotated), ``timestamp`` (epoch seconds, sent whole) where
    the scheme signs one, and ``event_id`` as Standard Webhooks' message id (required there)."""
    stamp = str(int(timestamp))
    name = config.signature_header

    def digests(signed: bytes) -> list[str]:
        return [
            _encode(hmac.new(key, signed, config.algorithm).digest(), config.encoding)
            for key in config.keys
        ]

    if config.scheme == "standard-webhooks":
        if not event_id:
            raise ValueError("a Standard Webhooks delivery needs its event_id (webhook-id)")
        id_header, stamp_header = _standard_headers(config)
        signed = f"{event_id}.{stamp}.".encode() + body
        return {
            id_header: event_id,
            stamp_header: stamp,
            name: " ".join(f"v1,{sig}" for sig in digests(signed)),
        }
    if config.scheme == "timestamped":
        signatures = ",".join(f"v1={sig}" for sig in digests(f"{stamp}.".encode() + body))
        return {name: f"t={stamp},{signatures}"}
    if config.timestamp_header is None:
        return {name: ",".join(config.signature_prefix + sig for sig in digests(body))}
    signed = f"{stamp}.".encode() + body
    return {
        config.timestamp_header: stamp,
        name: ",".join(config.signature_prefix + sig for sig in digests(signed)),
    }
